// Scalar activation formulas, header-only, shared by the core's layers and every backend
// so that one definition serves all evaluators.
#pragma once

#include <cmath>
#include <numbers>

namespace polyprobe::kernels {

template <class S>
S relu(S v) {
  return v > S(0) ? v : S(0);
}

// Exact GELU (erf form, nn.GELU()).
template <class S>
S gelu(S v) {
  return S(0.5) * v * (S(1) + std::erf(v / std::numbers::sqrt2_v<S>));
}

// GELU, tanh form (nn.GELU(approximate="tanh")).
template <class S>
S gelu_tanh(S v) {
  const S c = std::sqrt(S(2) / std::numbers::pi_v<S>);
  return S(0.5) * v * (S(1) + std::tanh(c * (v + S(0.044715) * v * v * v)));
}

template <class S>
S sign(S v) {
  return v > S(0) ? S(1) : (v < S(0) ? S(-1) : S(0));
}

// step * floor(v / step).
template <class S>
S staircase(S v, S step) {
  return step * std::floor(v / step);
}

}  // namespace polyprobe::kernels
