// Losses and the objective.
//
// A Loss computes one loss per sample from model outputs and targets. The objective of a
// parameter vector on a batch is the mean per-sample loss plus l2 * sum(theta^2); every
// evaluator must compute exactly this, and `objective()` below is its definition.
#pragma once

#include <polyprobe/batch.hpp>
#include <polyprobe/tensor.hpp>

#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace polyprobe {

class Model;

class Loss {
 public:
  virtual ~Loss() = default;
  virtual std::string name() const = 0;
  // out[r] = loss of outputs row r against targets row first_row + r.
  virtual void per_sample(ConstMatrixRef<float> outputs, const Targets& targets, int64_t first_row,
                          std::span<float> out) const = 0;
  virtual void per_sample(ConstMatrixRef<double> outputs, const Targets& targets, int64_t first_row,
                          std::span<double> out) const = 0;
  // Whether targets are class labels (else a value matrix).
  virtual bool needs_labels() const { return true; }
  // Throws polyprobe::Error when targets do not fit outputs of `out_features` columns.
  virtual void check_targets(const Targets& targets, int64_t out_features) const;

  double l2 = 0.0;  // weight of sum(theta^2) in the objective
};

// "cross_entropy", "mse", "hinge" or "zero_one"; throws polyprobe::Error otherwise.
std::unique_ptr<Loss> make_loss(std::string_view name, double l2 = 0.0);

// The objective in float64 or float32 compute: mean per-sample loss + l2 * |params|^2.
double objective(const Model& model, const Loss& loss, const Batch& batch,
                 std::span<const double> params, DType dtype = DType::f64);

}  // namespace polyprobe
