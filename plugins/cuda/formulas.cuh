// Device copies of the formulas in polyprobe/plugin/kernels/{activations,losses}.hpp and of
// the linear layer's weight transforms (core/layers/linear.cpp). They are written to match
// those definitions operation by operation, in the same precision S, so that a CUDA loss
// differs from the core's only by the rounding of the device's math library.
#pragma once

#include <polyprobe/plugin/ops.h>

#include <cmath>
#include <cstdint>

namespace polyprobe::cuda {

// Q(w) in double, as Linear::apply does it.
__host__ __device__ inline double transform(int32_t t, double v, double step) {
  switch (t) {
    case PP_TRANSFORM_SIGN:
      return v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0);
    case PP_TRANSFORM_INT8: {
      const double q = nearbyint(v / step);
      return (q < -127.0 ? -127.0 : (q > 127.0 ? 127.0 : q)) * step;
    }
    default:
      return v;
  }
}

// The effective weight in compute precision S: the host casts the parameter vector to S
// before the layer runs, and the layer quantises that S value in double.
template <class S>
__host__ __device__ inline S effective(int32_t t, double raw, double step) {
  return static_cast<S>(transform(t, static_cast<double>(static_cast<S>(raw)), step));
}

template <class S>
__device__ inline S activate(int32_t fn, S v, S step) {
  switch (fn) {
    case PP_ACT_RELU:
      return v > S(0) ? v : S(0);
    case PP_ACT_GELU:
      // S(0.5) * v * (S(1) + erf(v / sqrt2_v<S>))
      return S(0.5) * v * (S(1) + erf(v / static_cast<S>(1.41421356237309504880168872420969808)));
    case PP_ACT_GELU_TANH: {
      const S c = sqrt(S(2) / static_cast<S>(3.14159265358979323846264338327950288));
      return S(0.5) * v * (S(1) + tanh(c * (v + S(0.044715) * v * v * v)));
    }
    case PP_ACT_TANH:
      return tanh(v);
    case PP_ACT_SIGN:
      return v > S(0) ? S(1) : (v < S(0) ? S(-1) : S(0));
    case PP_ACT_STAIRCASE:
      return step * floor(v / step);
    default:
      return v;
  }
}

// The per-sample losses of kernels/losses.hpp (LossKind order: cross_entropy, mse, hinge,
// zero_one).
template <class S>
__device__ inline S loss_row(int32_t kind, const S* x, int64_t n, int64_t label,
                             const double* target) {
  switch (kind) {
    case 0: {  // cross_entropy
      S m = x[0];
      for (int64_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;  // std::max(m, x[i])
      S sum = 0;
      for (int64_t i = 0; i < n; ++i) sum += exp(x[i] - m);
      return m + log(sum) - x[label];
    }
    case 1: {  // mse
      S sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const S diff = x[i] - static_cast<S>(target[i]);
        sum += diff * diff;
      }
      return sum / static_cast<S>(n);
    }
    case 2: {  // hinge
      S sum = 0;
      for (int64_t i = 0; i < n; ++i)
        if (i != label) {
          const S h = S(1) - x[label] + x[i];
          sum += h > S(0) ? h : S(0);  // std::max(S(0), h): 0 for a NaN h too
        }
      return sum / static_cast<S>(n);
    }
    case 3: {  // zero_one
      int64_t best = 0;
      for (int64_t i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
      return best == label ? S(0) : S(1);
    }
    default:
      return S(0);
  }
}

// nn.MaxPool2d / nn.AvgPool2d at output (oi, oj) of an [ih, iw] plane whose value at (i, j) is
// at(i, j): the window read row by row, padding skipped, the average over the whole window
// (count_include_pad), NaN propagating through max, as in PyTorch. The pooling op and the
// site-local conv tail both pool through this, so they agree to the bit.
template <class S, class At>
__device__ inline S pool_window(const pp_pool_attrs& a, int64_t oi, int64_t oj, int64_t ih,
                                int64_t iw, At at) {
  S acc = a.average ? S(0) : -static_cast<S>(INFINITY);
  for (int64_t ki = 0; ki < a.kernel[0]; ++ki) {
    const int64_t i = oi * a.stride[0] + ki - a.padding[0];
    if (i < 0 || i >= ih) continue;
    for (int64_t kj = 0; kj < a.kernel[1]; ++kj) {
      const int64_t j = oj * a.stride[1] + kj - a.padding[1];
      if (j < 0 || j >= iw) continue;
      const S v = at(i, j);
      if (a.average)
        acc += v;
      else if (v > acc || isnan(v))
        acc = v;
    }
  }
  return a.average ? acc / static_cast<S>(a.kernel[0] * a.kernel[1]) : acc;
}

}  // namespace polyprobe::cuda
