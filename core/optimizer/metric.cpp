// BFGS on the inverse Hessian and its unit-determinant Cholesky factor.
#include "metric.hpp"

#include <Eigen/Cholesky>

#include <cmath>

namespace polyprobe::detail {

bool bfgs_update(MatrixRef<double> inverse, std::span<const double> s, std::span<const double> y,
                 bool first) {
  const auto d = static_cast<Eigen::Index>(s.size());
  const Eigen::Map<const Vector<double>> sv(s.data(), d), yv(y.data(), d);
  const double sy = sv.dot(yv);
  // Finite-difference gradients are noisy: demand clear positive curvature along s, not
  // merely s'y > 0, or a noise-driven pair would wreck the estimate.
  if (!(sy > 1e-8 * sv.norm() * yv.norm()) || !std::isfinite(sy)) return false;
  Matrix<double> next = inverse;
  if (first) next *= sy / yv.squaredNorm();
  // H+ = (I - rho s y') H (I - rho y s') + rho s s', expanded so it costs O(d^2).
  const double rho = 1.0 / sy;
  const Vector<double> hy = next * yv;
  const double yhy = yv.dot(hy);
  next.noalias() -= rho * (hy * sv.transpose() + sv * hy.transpose());
  next.noalias() += (rho * rho * yhy + rho) * (sv * sv.transpose());
  if (!next.allFinite()) return false;
  inverse = next;
  return true;
}

bool unit_determinant_factor(const ConstMatrixRef<double>& inverse, MatrixRef<double> factor) {
  const Eigen::LLT<Matrix<double>> llt(inverse);
  factor.setIdentity();
  if (llt.info() != Eigen::Success) return false;
  const Matrix<double> lower = llt.matrixL();
  const auto diagonal = lower.diagonal();
  if (!(diagonal.minCoeff() > 0) || !lower.allFinite()) return false;
  if (diagonal.maxCoeff() > 1e6 * diagonal.minCoeff()) return false;
  const double log_det = diagonal.array().log().mean();
  factor = lower * std::exp(-log_det);
  return true;
}

}  // namespace polyprobe::detail
