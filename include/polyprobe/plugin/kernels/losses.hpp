// Per-sample loss formulas, header-only, shared by the core and every backend so that all
// evaluators compute the same objective from one definition. Each takes one row of model
// outputs (n values) and returns the sample's loss in the row's precision S.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace polyprobe::kernels {

// -log softmax(x)[label], stabilised by the row maximum (nn.CrossEntropyLoss).
template <class S>
S cross_entropy_row(const S* x, int64_t n, int64_t label) {
  S m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  S sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - m);
  return m + std::log(sum) - x[label];
}

// Mean squared error over the n outputs (nn.MSELoss, mean reduction, for one sample).
template <class S>
S mse_row(const S* x, int64_t n, const double* target) {
  S sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const S diff = x[i] - static_cast<S>(target[i]);
    sum += diff * diff;
  }
  return sum / static_cast<S>(n);
}

// Multi-class hinge: sum over i != label of max(0, 1 - x[label] + x[i]), over n
// (nn.MultiMarginLoss).
template <class S>
S hinge_row(const S* x, int64_t n, int64_t label) {
  S sum = 0;
  for (int64_t i = 0; i < n; ++i)
    if (i != label) sum += std::max(S(0), S(1) - x[label] + x[i]);
  return sum / static_cast<S>(n);
}

// 0-1 error: 0 when the first maximal output is the label (torch.argmax), else 1.
template <class S>
S zero_one_row(const S* x, int64_t n, int64_t label) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best == label ? S(0) : S(1);
}

enum class LossKind { cross_entropy, mse, hinge, zero_one, unknown };

inline LossKind loss_kind(const char* name) {
  const auto is = [name](const char* s) {
    const char* a = name;
    while (*a != '\0' && *a == *s) ++a, ++s;
    return *a == *s;
  };
  if (name == nullptr) return LossKind::unknown;
  if (is("cross_entropy")) return LossKind::cross_entropy;
  if (is("mse")) return LossKind::mse;
  if (is("hinge")) return LossKind::hinge;
  if (is("zero_one")) return LossKind::zero_one;
  return LossKind::unknown;
}

// The loss of one row by kind; `label` for classification, `target` (n values) for mse.
template <class S>
S loss_row(LossKind kind, const S* x, int64_t n, int64_t label, const double* target) {
  switch (kind) {
    case LossKind::cross_entropy:
      return cross_entropy_row(x, n, label);
    case LossKind::mse:
      return mse_row(x, n, target);
    case LossKind::hinge:
      return hinge_row(x, n, label);
    case LossKind::zero_one:
      return zero_one_row(x, n, label);
    case LossKind::unknown:
      break;
  }
  return S(0);
}

}  // namespace polyprobe::kernels
