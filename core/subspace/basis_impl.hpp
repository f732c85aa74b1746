// Internal to core/subspace: orthonormal bases drawn from Gaussian matrices.
#pragma once

#include <Eigen/Core>
#include <Eigen/QR>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace polyprobe::detail {

// The thin Q factor (n x r) of a Gaussian n x r matrix drawn from `rng` (row-major draw
// order), returned column by column: r vectors of n values each. With `float32` each value
// is rounded to float32, as the reference workloads store their bases.
inline std::vector<std::vector<double>> orthonormal_columns(int64_t n, int64_t r, bool float32,
                                                            std::mt19937_64& rng) {
  std::normal_distribution<double> gauss;
  Eigen::MatrixXd g(n, r);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < r; ++j) g(i, j) = gauss(rng);
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
  const Eigen::MatrixXd q = qr.householderQ() * Eigen::MatrixXd::Identity(n, r);
  // The sign fix that makes the factorisation unique (R with a positive diagonal).
  const Eigen::MatrixXd rmat = qr.matrixQR().topRows(r).triangularView<Eigen::Upper>();
  std::vector<std::vector<double>> columns(static_cast<std::size_t>(r));
  for (int64_t j = 0; j < r; ++j) {
    const double sign = rmat(j, j) < 0 ? -1.0 : 1.0;
    auto& col = columns[static_cast<std::size_t>(j)];
    col.resize(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const double v = sign * q(i, j);
      col[static_cast<std::size_t>(i)] = float32 ? static_cast<double>(static_cast<float>(v)) : v;
    }
  }
  return columns;
}

// A parameter tensor as a matrix: rows = first dimension, cols = the rest (1 for a vector).
struct MatrixShape {
  int64_t rows, cols;
  bool is_matrix;
};
inline MatrixShape matrix_shape(const std::vector<int64_t>& shape) {
  if (shape.size() < 2) return {shape.empty() ? 1 : shape[0], 1, false};
  int64_t cols = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  return {shape[0], cols, true};
}

}  // namespace polyprobe::detail
