// Sequential models and the layer factory.
//
// A Model is a sequence of layers with one flat float64 parameter vector, laid out in
// PyTorch's `model.parameters()` order (layer 0's weight row-major, its bias, layer 1's,
// ...) and named as nn.Sequential names them ("0.weight", "0.bias", "2.weight"). Layers are
// immutable and shared between copies, so copying a Model copies only its parameters. The
// model's dtype is how its weights are stored and the default compute precision; the
// master copy here is always float64.
#pragma once

#include <polyprobe/layer.hpp>
#include <polyprobe/tensor.hpp>

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace polyprobe {

class OperationTable;

struct ParameterEntry {
  std::string name;  // "0.weight"
  std::size_t layer;
  std::vector<int64_t> shape;
  int64_t offset;  // into the flat vector
  int64_t size;
};

class Model {
 public:
  explicit Model(Shape input_shape, DType dtype = DType::f32);

  // Appends a layer; throws polyprobe::Error when its input shape is not the current output.
  void add(std::shared_ptr<const Layer> layer);

  const Shape& input_shape() const { return input_shape_; }
  const Shape& output_shape() const;
  DType dtype() const { return dtype_; }
  std::size_t num_layers() const { return layers_.size(); }
  const Layer& layer(std::size_t i) const { return *layers_.at(i); }
  std::shared_ptr<const Layer> layer_ptr(std::size_t i) const { return layers_.at(i); }

  int64_t num_parameters() const { return static_cast<int64_t>(params_.size()); }
  std::span<double> parameters() { return params_; }
  std::span<const double> parameters() const { return params_; }
  const std::vector<ParameterEntry>& parameter_entries() const { return entries_; }
  // Offset of layer i's first parameter in the flat vector.
  int64_t layer_offset(std::size_t i) const { return layer_offsets_.at(i); }

  // PyTorch-style default initialisation, reproducible from `seed`.
  void initialize(uint64_t seed);

  // Outputs [B, out] for inputs [B, in] with the given flat parameters (default: own).
  template <class S>
  Matrix<S> forward(ConstMatrixRef<S> x, std::span<const double> params) const;
  template <class S>
  Matrix<S> forward(ConstMatrixRef<S> x) const {
    return forward<S>(x, params_);
  }
  // The same, with the flat parameters already in S (params_as<S>()): many forwards of one
  // state (the chunks of an evaluation) convert them once rather than once each.
  template <class S>
  Matrix<S> forward_converted(ConstMatrixRef<S> x, std::span<const S> params) const;
  // The flat parameters converted to S.
  template <class S>
  std::vector<S> params_as() const {
    return std::vector<S>(params_.begin(), params_.end());
  }

 private:
  Shape input_shape_;
  DType dtype_;
  std::vector<std::shared_ptr<const Layer>> layers_;
  std::vector<int64_t> layer_offsets_;
  std::vector<ParameterEntry> entries_;
  std::vector<double> params_;
};

// Creates layers by kind name ("linear", "relu", ... and kinds that plugins add).
class LayerFactory {
 public:
  using Create = std::function<std::shared_ptr<const Layer>(const nlohmann::json& attrs,
                                                            const Shape& input_shape)>;
  struct Entry {
    Create create;
    std::string summary;
    std::string provider;  // "core" or the plugin's name
  };

  // An empty factory (no kinds, no operations).
  LayerFactory();
  // A factory holding the core's built-in layer kinds.
  static LayerFactory with_builtins();

  // Adds a kind; throws polyprobe::Error if the kind already exists.
  void add(const std::string& kind, Entry entry);
  bool contains(const std::string& kind) const { return kinds_.contains(kind); }
  // Throws polyprobe::Error naming the known kinds when `kind` is unknown.
  std::shared_ptr<const Layer> create(const std::string& kind, const nlohmann::json& attrs,
                                      const Shape& input_shape) const;
  const std::map<std::string, Entry>& kinds() const { return kinds_; }

  // The named operations (operations.hpp) that the layers this factory creates may use,
  // shared with them (and with copies of this factory); never null. Empty until a plugin
  // registry fills it (PluginRegistry::register_layers): the layers then compute
  // everything themselves.
  const std::shared_ptr<OperationTable>& operations() const { return operations_; }

 private:
  std::map<std::string, Entry> kinds_;
  std::shared_ptr<OperationTable> operations_;
};

}  // namespace polyprobe
