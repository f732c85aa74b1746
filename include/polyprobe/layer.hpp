// Layers and their contracts.
//
// A Layer is one step of a sequential model: it is created for a fixed per-sample input
// shape, owns no parameter storage (the model's flat vector does), and runs forward on a
// [batch, in_features] matrix in float32 or float64. Its LayerContract states, as data,
// what candidate evaluators may exploit; contracts are probed on sample inputs before a
// fast path relies on them, so a false declaration costs speed, never a wrong loss. A
// layer that declares nothing is still evaluated correctly by the fallback path.
#pragma once

#include <polyprobe/plugin/abi.h>
#include <polyprobe/tensor.hpp>

#include <nlohmann/json_fwd.hpp>

#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace polyprobe {

// A scalar function as the ABI carries it: a C function pointer and its context.
struct ScalarFn {
  pp_scalar_fn fn = nullptr;
  const void* ctx = nullptr;
  double operator()(double x) const { return fn(ctx, x); }
  explicit operator bool() const { return fn != nullptr; }
};

struct LayerContract {
  // No parameters and y[i] = f(x[i]) for one scalar function f (continuous or not).
  bool elementwise = false;
  // y = x Q(W)^T + Qb(b) with W [out, in] and b [out] the layer's parameters, in that order.
  bool affine = false;
  bool affine_has_bias = false;
  // Parameters act per position (convolution, attention).
  bool site_local = false;
  // The output depends only on the input and the layer's own parameters.
  bool prefix_reusable = true;
  ScalarFn elementwise_fn;    // (optional) f, for elementwise layers
  ScalarFn weight_transform;  // Q; empty = identity
  ScalarFn bias_transform;    // Qb; empty = identity

  uint32_t flags() const;  // as PP_CONTRACT_* bits
};

struct ParamSpec {
  std::string name;  // PyTorch's name within the module: "weight", "bias"
  std::vector<int64_t> shape;
  int64_t numel() const;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string kind() const = 0;
  // The attributes that recreate this layer from a model file (the input shape aside).
  virtual nlohmann::json attributes() const;
  virtual LayerContract contract() const { return {}; }
  virtual std::vector<ParamSpec> parameters() const { return {}; }
  virtual const Shape& input_shape() const = 0;
  virtual const Shape& output_shape() const = 0;
  // y [B, out] from x [B, in]; params holds this layer's parameters in declared order.
  virtual void forward(ConstMatrixRef<float> x, std::span<const float> params,
                       MatrixRef<float> y) const = 0;
  virtual void forward(ConstMatrixRef<double> x, std::span<const double> params,
                       MatrixRef<double> y) const = 0;
  // Initial parameter values (PyTorch's defaults where PyTorch has the layer).
  virtual void initialize(std::span<double> params, std::mt19937_64& rng) const;

  int64_t parameter_count() const;
};

// Implements both forward overloads from one template `forward_impl<S>` of Derived.
template <class Derived>
class LayerBase : public Layer {
 public:
  void forward(ConstMatrixRef<float> x, std::span<const float> params,
               MatrixRef<float> y) const final {
    static_cast<const Derived*>(this)->template forward_impl<float>(x, params, y);
  }
  void forward(ConstMatrixRef<double> x, std::span<const double> params,
               MatrixRef<double> y) const final {
    static_cast<const Derived*>(this)->template forward_impl<double>(x, params, y);
  }
};

}  // namespace polyprobe
