// Basic numeric types shared by the core's C++ API: dtypes, shapes and row-major matrices.
//
// Activations are [batch, features] row-major matrices: one sample per row, the features
// of a sample flattened from its per-sample Shape (e.g. [C, L] for a sequence). Parameters
// live in one flat float64 vector per model (the search vector); evaluators compute in
// float32 or float64 as asked and convert at registration.
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace polyprobe {

enum class DType { f32, f64 };

std::string_view to_string(DType dtype);
// Parses "float32"/"f32" or "float64"/"f64"; throws polyprobe::Error otherwise.
DType parse_dtype(std::string_view name);

template <class S>
using Matrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using Vector = Eigen::Matrix<S, Eigen::Dynamic, 1>;
template <class S>
using MatrixRef = Eigen::Ref<Matrix<S>>;
template <class S>
using ConstMatrixRef = Eigen::Ref<const Matrix<S>>;

// A per-sample shape, e.g. {64} for features or {C, L} for a sequence.
struct Shape {
  std::vector<int64_t> dims;
  int64_t numel() const;
  std::string str() const;  // "[C, L]"
  bool operator==(const Shape&) const = default;
};

}  // namespace polyprobe
