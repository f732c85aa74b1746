// Kernels and attribute parsers shared by several layer kinds, so that each formula (layer
// normalisation, PyTorch's default initialisation, window geometry) has one definition.
#pragma once

#include <polyprobe/error.hpp>
#include <polyprobe/tensor.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <random>
#include <span>
#include <string>

namespace polyprobe::layers {

// Sample b of a row-major activation matrix (rows are contiguous; the outer stride may
// exceed the row length when the matrix is a block of a larger one).
template <class S>
const S* sample_in(const ConstMatrixRef<S>& x, Eigen::Index b) {
  return x.data() + b * x.outerStride();
}
template <class S>
S* sample_out(MatrixRef<S>& y, Eigen::Index b) {
  return y.data() + b * y.outerStride();
}

// Normalises each of `groups` consecutive runs of n values to zero mean and unit variance
// (biased variance, as nn.LayerNorm), then applies the optional affine gain and shift
// (n values each). Statistics accumulate in double whatever S is.
template <class S>
void layer_norm_groups(const S* in, S* out, int64_t groups, int64_t n, double eps, const S* gain,
                       const S* shift) {
  for (int64_t g = 0; g < groups; ++g) {
    const S* x = in + g * n;
    S* y = out + g * n;
    double mean = 0.0;
    for (int64_t i = 0; i < n; ++i) mean += static_cast<double>(x[i]);
    mean /= static_cast<double>(n);
    double var = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(x[i]) - mean;
      var += d * d;
    }
    var /= static_cast<double>(n);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < n; ++i) {
      S v = static_cast<S>((static_cast<double>(x[i]) - mean) * inv);
      if (gain != nullptr) v *= gain[i];
      if (shift != nullptr) v += shift[i];
      y[i] = v;
    }
  }
}

// PyTorch's default for Linear and Conv weights and biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
inline void fill_fan_in_uniform(std::span<double> values, int64_t fan_in, std::mt19937_64& rng) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  std::uniform_real_distribution<double> u(-bound, bound);
  for (double& v : values) v = u(rng);
}

// A spatial attribute given as one integer (every spatial dim) or a list of `dims` integers.
// Returns {1, v} for a 1-D attribute so 1-D layers run as 2-D layers of height 1.
std::array<int64_t, 2> spatial_attribute(const nlohmann::json& attrs, const char* kind,
                                         const char* name, int dims, int64_t fallback,
                                         int64_t minimum);

// The window arithmetic of convolution and pooling over a [C, H, W] sample (H = 1 for 1-D).
struct Window {
  std::array<int64_t, 2> kernel{1, 1}, stride{1, 1}, padding{0, 0}, dilation{1, 1};
  std::array<int64_t, 2> in{1, 1}, out{1, 1};
  // Parses kernel_size, stride (default `default_stride`, or kernel_size when 0), padding and
  // (if `with_dilation`) dilation, and computes out; throws when the output would be empty.
  static Window parse(const nlohmann::json& attrs, const char* kind, int dims,
                      const std::array<int64_t, 2>& in, bool with_dilation, bool stride_is_kernel);
  int64_t out_positions() const { return out[0] * out[1]; }
};

// Splits a [C, L] or [C, H, W] input shape into {C, {H, W}} (H = 1 for 1-D), or throws.
struct SpatialInput {
  int64_t channels = 0;
  std::array<int64_t, 2> size{1, 1};
};
SpatialInput spatial_input(const Shape& input, const char* kind, int dims);
Shape spatial_shape(int64_t channels, const std::array<int64_t, 2>& size, int dims);

}  // namespace polyprobe::layers
