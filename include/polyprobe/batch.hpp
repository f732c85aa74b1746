// A minibatch: inputs and their targets.
//
// Inputs are float64 [B, in_features]; targets are class labels for classification
// losses or a float64 [B, out_features] matrix for regression losses. Evaluators convert
// a batch to their compute dtype once, at registration.
#pragma once

#include <polyprobe/tensor.hpp>

#include <cstdint>
#include <vector>

namespace polyprobe {

struct Targets {
  std::vector<int64_t> labels;  // classification
  Matrix<double> values;        // regression
  bool is_classification() const { return !labels.empty(); }
};

struct Batch {
  Matrix<double> inputs;
  Targets targets;
  int64_t size() const { return inputs.rows(); }
};

}  // namespace polyprobe
