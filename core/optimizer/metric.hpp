// The learned metric of a particle (internal): a quasi-Newton shape for its polytope.
//
// With OptimizerConfig::metric = bfgs every particle keeps an estimate H^-1 of its inverse
// Hessian, updated by BFGS from the pair (s, y) of its last move and the change of its
// finite-difference gradient. The polytope is sheared by L, the Cholesky factor of H^-1
// scaled to unit determinant, so probes stretch along the valley floor and the barycentric
// move follows -H^-1 g instead of -g; the radii keep setting the size. These helpers are the
// linear algebra, kept apart so the tests can check them exactly.
#pragma once

#include <polyprobe/tensor.hpp>

#include <span>

namespace polyprobe::detail {

// BFGS update of the inverse Hessian estimate `inverse` (d x d, symmetric positive definite)
// with step s and gradient change y, so that afterwards inverse * y = s (the secant
// equation). `first`: scale the estimate by s'y / y'y first (Nocedal & Wright, eq. 6.20),
// which sets the size of the initial identity. Returns false and leaves `inverse` unchanged
// when s'y is not safely positive (the update would lose positive definiteness) or not finite.
bool bfgs_update(MatrixRef<double> inverse, std::span<const double> s, std::span<const double> y,
                 bool first);

// Writes the lower-triangular factor L with L L^T = c * inverse and det L = 1. Returns false
// and writes the identity when `inverse` is not positive definite, or its factor is so
// ill-conditioned (diagonal ratio above 1e6) that probes along it would not resolve anything.
bool unit_determinant_factor(const ConstMatrixRef<double>& inverse, MatrixRef<double> factor);

}  // namespace polyprobe::detail
