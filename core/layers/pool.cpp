// Pooling (max and average, 1-D and 2-D) and flatten: the parameter-free reshaping layers of
// a convolutional network.
//
// Pooling runs over [C, L] or [C, H, W] samples as nn.MaxPool1d/2d and nn.AvgPool1d/2d do:
// stride defaults to kernel_size, max pooling pads with -infinity, average pooling counts
// the zero padding (count_include_pad = True, PyTorch's default). Flatten is nn.Flatten():
// the sample's values in the same order, shape [numel]; as y[i] = x[i] it is elementwise.
#include "layers/builtin.hpp"
#include "layers/ops.hpp"

#include <algorithm>
#include <limits>
#include <vector>

namespace polyprobe {
namespace {

using layers::Window;

enum class PoolOp { max, average };

class Pool final : public LayerBase<Pool> {
 public:
  Pool(const char* kind, int dims, PoolOp op, const nlohmann::json& attrs, const Shape& input)
      : kind_(kind), dims_(dims), op_(op), input_(input) {
    check_attribute_names(attrs, kind, {"kernel_size", "stride", "padding"});
    const layers::SpatialInput in = layers::spatial_input(input, kind, dims);
    channels_ = in.channels;
    window_ = Window::parse(attrs, kind, dims, in.size, /*with_dilation=*/false,
                            /*stride_is_kernel=*/true);
    for (int axis = 0; axis < 2; ++axis)
      if (2 * window_.padding[axis] > window_.kernel[axis])
        throw Error(std::string("layer '") + kind + "': padding must be at most half of " +
                    "kernel_size (as in PyTorch)");
    output_ = layers::spatial_shape(channels_, window_.out, dims);
    pairs_ = window_.kernel[1] == 2 && window_.stride[1] == 2 && window_.padding[1] == 0 &&
             window_.kernel[0] == window_.stride[0] && window_.kernel[0] <= 2 &&
             window_.padding[0] == 0;
    // Output columns oj whose tap kj falls inside a row: 0 <= oj s + kj - p < width.
    const int64_t s1 = window_.stride[1];
    for (int64_t kj = 0; kj < window_.kernel[1]; ++kj) {
      const int64_t shift = kj - window_.padding[1];
      taps_.push_back({shift, shift >= 0 ? 0 : (-shift + s1 - 1) / s1,
                       std::min<int64_t>(window_.out[1], (window_.in[1] - shift + s1 - 1) / s1)});
    }
  }

  std::string kind() const override { return kind_; }
  nlohmann::json attributes() const override {
    const auto spatial = [&](const std::array<int64_t, 2>& v) {
      return dims_ == 1 ? nlohmann::json(v[1]) : nlohmann::json(v);
    };
    return {{"kernel_size", spatial(window_.kernel)},
            {"stride", spatial(window_.stride)},
            {"padding", spatial(window_.padding)}};
  }
  const Shape& input_shape() const override { return input_; }
  const Shape& output_shape() const override { return output_; }

  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S>, MatrixRef<S> y) const {
    // Candidates' suffixes run through here once per candidate and sample, so the taps are
    // visited row by row with the output positions of a row innermost: independent
    // accumulators, bounds clamped once per tap (not tested per value), and a comparison
    // that keeps NaN (as PyTorch does) without a branch, so the loop vectorises.
    if (op_ == PoolOp::max && pairs_) {
      max_pool_pairs(x, y);
      return;
    }
    const Window& w = window_;
    const S window_size = static_cast<S>(w.kernel[0] * w.kernel[1]);
    const int64_t height = w.in[0], width = w.in[1], out_h = w.out[0], out_w = w.out[1];
    const int64_t s1 = w.stride[1];
    for (Eigen::Index b = 0; b < x.rows(); ++b) {
      const S* in = layers::sample_in(x, b);
      S* out = layers::sample_out(y, b);
      for (int64_t c = 0; c < channels_; ++c, in += height * width)
        for (int64_t oi = 0; oi < out_h; ++oi, out += out_w) {
          std::fill(out, out + out_w,
                    op_ == PoolOp::max ? -std::numeric_limits<S>::infinity() : S(0));
          const int64_t top = oi * w.stride[0] - w.padding[0];
          for (int64_t i = std::max<int64_t>(top, 0);
               i < std::min<int64_t>(top + w.kernel[0], height); ++i)
            for (const ColumnTap& tap : taps_) {
              const int64_t first = tap.first, last = tap.last;
              const S* row = in + i * width + tap.shift;
              if (op_ == PoolOp::average)
                for (int64_t oj = first; oj < last; ++oj) out[oj] += row[oj * s1];
              else
                for (int64_t oj = first; oj < last; ++oj) {
                  const S v = row[oj * s1];
                  out[oj] = (v > out[oj] || v != v) ? v : out[oj];
                }
            }
          if (op_ == PoolOp::average)
            for (int64_t oj = 0; oj < out_w; ++oj) out[oj] /= window_size;
        }
    }
  }

  // 2 x 2 max pooling with stride 2 and no padding (and its 1-D form, 1 x 2), the usual
  // case: each output reads two adjacent values of one or two rows.
  template <class S>
  void max_pool_pairs(ConstMatrixRef<S> x, MatrixRef<S> y) const {
    const auto pick = [](S a, S v) { return (v > a || v != v) ? v : a; };  // keeps NaN
    const int64_t width = window_.in[1], out_h = window_.out[0], out_w = window_.out[1];
    const int64_t rows = window_.kernel[0], plane = window_.in[0] * width;
    for (Eigen::Index b = 0; b < x.rows(); ++b) {
      const S* in = layers::sample_in(x, b);
      S* out = layers::sample_out(y, b);
      for (int64_t c = 0; c < channels_; ++c, in += plane)
        for (int64_t oi = 0; oi < out_h; ++oi, out += out_w) {
          const S* r0 = in + oi * rows * width;
          const S* r1 = rows == 2 ? r0 + width : r0;
          for (int64_t oj = 0; oj < out_w; ++oj)
            out[oj] = pick(pick(pick(r0[2 * oj], r0[2 * oj + 1]), r1[2 * oj]), r1[2 * oj + 1]);
        }
    }
  }

 private:
  const char* kind_;
  int dims_;
  PoolOp op_;
  Shape input_, output_;
  int64_t channels_ = 0;
  Window window_;
  struct ColumnTap {
    int64_t shift, first, last;  // tap kj reads column oj s + shift for oj in [first, last)
  };
  std::vector<ColumnTap> taps_;  // one per kernel column
  bool pairs_ = false;           // max_pool_pairs serves this window
};

class Flatten final : public LayerBase<Flatten> {
 public:
  Flatten(const nlohmann::json& attrs, const Shape& input)
      : input_(input), output_{{input.numel()}} {
    check_attribute_names(attrs, "flatten", {});
  }
  std::string kind() const override { return "flatten"; }
  const Shape& input_shape() const override { return input_; }
  const Shape& output_shape() const override { return output_; }
  LayerContract contract() const override {
    LayerContract c;
    c.elementwise = true;
    c.elementwise_fn = {&identity, nullptr};
    return c;
  }
  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S>, MatrixRef<S> y) const {
    y = x;
  }

 private:
  static double identity(const void*, double v) { return v; }
  Shape input_, output_;
};

void add_pool(LayerFactory& factory, const char* kind, int dims, PoolOp op, const char* summary) {
  factory.add(kind, {[kind, dims, op](const nlohmann::json& attrs, const Shape& input) {
                       return std::make_shared<const Pool>(kind, dims, op, attrs, input);
                     },
                     summary, "core"});
}

}  // namespace

void register_pool(LayerFactory& factory) {
  add_pool(factory, "max_pool1d", 1, PoolOp::max,
           "nn.MaxPool1d on [C, L]; attributes kernel_size, stride (= kernel_size), padding");
  add_pool(factory, "max_pool2d", 2, PoolOp::max,
           "nn.MaxPool2d on [C, H, W]; attributes kernel_size, stride (= kernel_size), padding");
  add_pool(factory, "avg_pool1d", 1, PoolOp::average,
           "nn.AvgPool1d on [C, L]; attributes kernel_size, stride (= kernel_size), padding");
  add_pool(factory, "avg_pool2d", 2, PoolOp::average,
           "nn.AvgPool2d on [C, H, W]; attributes kernel_size, stride (= kernel_size), padding");
  factory.add("flatten", {[](const nlohmann::json& attrs, const Shape& input) {
                            return std::make_shared<const Flatten>(attrs, input);
                          },
                          "nn.Flatten(): any sample shape to [numel], values unchanged", "core"});
}

}  // namespace polyprobe
