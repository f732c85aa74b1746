// The channel-local tail of a convolution: planning, the probe, and one channel's pass.
#include "channel_tail.hpp"

#include "packets.hpp"
#include "site_local.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

namespace polyprobe::cpu_tbb {
namespace {

// Fills a pooling stage from the typed op (ops.h: a 1-D pool is a 2-D one of height 1);
// empty or why not.
std::string parse_pool(const pp_layer_view& v, int64_t channels, int64_t values, TailStage& st) {
  if (v.op != PP_OP_POOL || v.op_attrs == nullptr) return "a pooling layer without its typed op";
  const pp_pool_attrs& p = *static_cast<const pp_pool_attrs*>(v.op_attrs);
  const int dims = p.dims;
  if (dims != 1 && dims != 2) return "a pooling of " + std::to_string(dims) + " dimensions";
  if (v.in_ndim != dims + 1 || v.in_shape[0] != channels)
    return "an input other than the conv's channels";
  st.h = dims == 1 ? 1 : v.in_shape[1];
  st.w = v.in_shape[dims];
  if (st.h * st.w != values) return "an input other than the conv's channels";
  st.kh = p.kernel[0], st.kw = p.kernel[1];
  st.sh = p.stride[0], st.sw = p.stride[1];
  st.ph = p.padding[0], st.pw = p.padding[1];
  if (st.sh <= 0 || st.sw <= 0) return "pooling attributes out of range";
  if (st.kh <= 0 || st.kw <= 0 || st.ph < 0 || st.pw < 0 || 2 * st.ph > st.kh ||
      2 * st.pw > st.kw || st.h + 2 * st.ph < st.kh || st.w + 2 * st.pw < st.kw)
    return "pooling attributes out of range";
  st.oh = (st.h + 2 * st.ph - st.kh) / st.sh + 1;
  st.ow = (st.w + 2 * st.pw - st.kw) / st.sw + 1;
  if (numel(v.out_ndim, v.out_shape) != channels * st.oh * st.ow)
    return "an output shape that differs from the attributes";
  for (int64_t kj = 0; kj < st.kw; ++kj) {
    // column oj sw - pw + kj lies in [0, w) for oj in [first, last)
    const int64_t shift = kj - st.pw;
    const int64_t first = std::min(st.ow, shift >= 0 ? 0 : (-shift + st.sw - 1) / st.sw);
    const int64_t last =
        shift >= st.w ? first : std::clamp((st.w - 1 - shift) / st.sw + 1, first, st.ow);
    st.taps.push_back({shift, first, last});
  }
  st.pairs = st.kw == 2 && st.sw == 2 && st.kh == (dims == 1 ? 1 : 2) && st.sh == st.kh &&
             st.ph == 0 && st.pw == 0;
  return {};
}

// Max pooling's comparison: v if it is larger or NaN (NaN is kept, as PyTorch keeps it),
// without a branch so that loops over it vectorise.
template <class S>
S pick(S a, S v) {
  return (v > a || v != v) ? v : a;
}

// out[j] = pick(a[j], b[j]) for j < n: packets, the last one overlapping the one before it
// rather than a scalar remainder (a map row of 28 was 16 values in a vector and 12 one by
// one).
template <class S>
void pick_rows(const S* a, const S* b, S* out, int64_t n) {
  constexpr int64_t lanes = kLanes<S>;
  const auto packet = [&](int64_t j) {
    PacketMap<S>(out + j) = ConstPacketMap<S>(a + j).binaryExpr(
        ConstPacketMap<S>(b + j), Eigen::internal::scalar_max_op<S, S, Eigen::PropagateNaN>());
  };
  if (n < lanes) {
    for (int64_t j = 0; j < n; ++j) out[j] = pick(a[j], b[j]);
    return;
  }
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes) packet(j);
  if (j < n) packet(n - lanes);
}

// Pools every row of `in` (one channel's [h, w] map per sample) into `out` [rows, oh * ow]:
// max pooling pads with -infinity and keeps NaN (as PyTorch does, by a comparison without a
// branch so the loops vectorise), average pooling counts the zero padding. This runs once per
// conv candidate and sample, so the output positions of a row are innermost.
template <class S>
void pool_rows(const TailStage& st, const Mat<S>& in, Mat<S>& out) {
  out.resize(in.rows(), st.oh * st.ow);
  const bool is_max = st.op == TailStage::Op::max_pool;
  const S window = static_cast<S>(st.kh * st.kw);
  // 2 x 2 pairs over a map of even width: the maxima of row pairs, then of column pairs over
  // the whole flat map, two long contiguous loops. Window by window, an output row of 14 (a
  // 28-wide map) was half a vector and six scalar steps, the Fashion-MNIST cnn's largest cost
  // (22% of its run, perf). Same maxima; a window of zeros of both signs may keep the other.
  if (st.pairs && st.w == 2 * st.ow && st.h >= st.kh * st.oh) {
    std::vector<S> rows(static_cast<std::size_t>(st.oh * st.w));
    for (Eigen::Index r = 0; r < in.rows(); ++r) {
      const S* x = in.row(r).data();
      S* y = out.row(r).data();
      for (int64_t oi = 0; oi < st.oh; ++oi) {
        const S* r0 = x + oi * st.kh * st.w;
        const S* r1 = st.kh == 2 ? r0 + st.w : r0;
        pick_rows(r0, r1, rows.data() + oi * st.w, st.w);
      }
      for (int64_t t = 0; t < st.oh * st.ow; ++t) y[t] = pick(rows[2 * t], rows[2 * t + 1]);
    }
    return;
  }
  for (Eigen::Index r = 0; r < in.rows(); ++r) {
    const S* x = in.row(r).data();
    S* y = out.row(r).data();
    for (int64_t oi = 0; oi < st.oh; ++oi, y += st.ow) {
      if (st.pairs) {
        const S* r0 = x + oi * st.kh * st.w;
        const S* r1 = st.kh == 2 ? r0 + st.w : r0;
        for (int64_t oj = 0; oj < st.ow; ++oj)
          y[oj] = pick(pick(pick(r0[2 * oj], r0[2 * oj + 1]), r1[2 * oj]), r1[2 * oj + 1]);
        continue;
      }
      std::fill(y, y + st.ow, is_max ? -std::numeric_limits<S>::infinity() : S(0));
      const int64_t top = oi * st.sh - st.ph;
      for (int64_t i = std::max<int64_t>(top, 0); i < std::min(top + st.kh, st.h); ++i)
        for (const TailStage::ColumnTap& tap : st.taps) {
          const S* row = x + i * st.w + tap.shift;
          if (is_max)
            for (int64_t oj = tap.first; oj < tap.last; ++oj) y[oj] = pick(y[oj], row[oj * st.sw]);
          else
            for (int64_t oj = tap.first; oj < tap.last; ++oj) y[oj] += row[oj * st.sw];
        }
      if (!is_max)
        for (int64_t oj = 0; oj < st.ow; ++oj) y[oj] /= window;
    }
  }
}

// The tail's layers [conv + 1, affine) in float64 by their own forwards.
std::string host_tail(const ModelPlan& plan, std::size_t conv, std::size_t affine,
                      std::vector<double> x, int64_t rows, std::vector<double>& y) {
  const std::vector<double> none;
  for (std::size_t m = conv + 1; m < affine; ++m) {
    if (std::string why = host_forward(plan.layers[m], x, rows, none, y); !why.empty()) return why;
    x.swap(y);
  }
  y.swap(x);
  return {};
}

bool close(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || std::abs(a - b) <= 1e-12 * (1.0 + std::abs(b));
}

// Empty when a perturbed channel comes out of the layers' own forwards as the tail computes
// it and every other channel is unchanged, for the first, the last and a middle channel.
std::string probe_tail(const ModelPlan& plan, std::size_t conv, const ChannelTail& t) {
  std::mt19937_64 rng(0x7a11);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int64_t rows = 2, width = t.channels * t.positions;
  std::vector<double> x(static_cast<std::size_t>(rows * width)), y0, y1;
  for (double& v : x) v = gauss(rng);
  if (std::string why = host_tail(plan, conv, t.affine, x, rows, y0); !why.empty()) return why;
  const int64_t slices = t.channels * t.slice;
  if (static_cast<int64_t>(y0.size()) != rows * slices) return "the layers' output size";
  for (const int64_t o : {int64_t{0}, t.channels / 2, t.channels - 1}) {
    std::vector<double> moved = x;
    Mat<double> a(rows, t.positions), b;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t p = 0; p < t.positions; ++p) {
        double& v = moved[static_cast<std::size_t>(r * width + o * t.positions + p)];
        v += gauss(rng);
        a(r, p) = v;
      }
    if (std::string why = host_tail(plan, conv, t.affine, moved, rows, y1); !why.empty())
      return why;
    const Mat<double>& mine = run_channel_tail(t, a, b);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < slices; ++i) {
        const auto at = static_cast<std::size_t>(r * slices + i);
        const int64_t in_slice = i - o * t.slice;
        const bool ours = in_slice >= 0 && in_slice < t.slice;
        const double expect = ours ? mine(r, in_slice) : y0[at];
        if (!close(y1[at], expect))
          return "value " + std::to_string(i) + " is " + std::to_string(y1[at]) + " where " +
                 (ours ? "the tail gives " : "the unmoved channels give ") +
                 std::to_string(expect) + " (channel " + std::to_string(o) + " moved)";
      }
  }
  return {};
}

}  // namespace

ChannelTail plan_channel_tail(const ModelPlan& plan, std::size_t conv, int64_t channels,
                              int64_t height, int64_t width) {
  ChannelTail t;
  t.channels = channels;
  t.positions = height * width;
  int64_t values = t.positions;  // one channel's values after the stages so far
  std::string through;
  for (std::size_t m = conv + 1; m < plan.layers.size(); ++m) {
    const LayerPlan& layer = plan.layers[m];
    const std::string kind = layer.view->kind != nullptr ? layer.view->kind : "";
    const std::string named = "layer " + std::to_string(m) + " (" + kind + ")";
    if (layer.op == LayerOp::affine) {
      if (layer.in != channels * values) {
        t.note = "no channel-local tail: " + named + " does not take the channels' values";
        return t;
      }
      t.affine = m;
      t.slice = values;
      through += (through.empty() ? "" : ", ") + std::string("into ") + named;
      break;
    }
    TailStage st;
    std::string why;
    try {
      if (kind == "flatten" && layer.in == layer.out) {  // keeps the layout: no stage
        through += (through.empty() ? "" : ", ") + kind;
        continue;
      }
      if (layer.op == LayerOp::elementwise && (layer.is_relu || layer.view->elementwise_fn)) {
        st.op = layer.is_relu ? TailStage::Op::relu : TailStage::Op::scalar_fn;
        st.layer = &layer;
      } else if (kind == "max_pool2d" || kind == "avg_pool2d" || kind == "max_pool1d" ||
                 kind == "avg_pool1d") {
        st.op = kind.rfind("max", 0) == 0 ? TailStage::Op::max_pool : TailStage::Op::avg_pool;
        why = parse_pool(*layer.view, channels, values, st);
        values = st.oh * st.ow;
      } else {
        why = "it mixes channels or the tail does not know it";
      }
    } catch (const std::exception& e) {
      why = std::string("attributes not understood (") + e.what() + ")";
    }
    if (!why.empty()) {
      t.note = "no channel-local tail: " + named + ": " + why;
      return t;
    }
    t.stages.push_back(st);
    through += (through.empty() ? "" : ", ") + kind;
  }
  if (t.slice == 0) {
    t.note = "no channel-local tail: no affine layer follows";
    return t;
  }
  std::string why;
  try {
    why = probe_tail(plan, conv, t);
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!why.empty()) {
    t.note = "no channel-local tail: probe failed: " + why;
    t.stages.clear();
    return t;
  }
  t.usable = true;
  t.note = "channel-local tail through " + through;
  return t;
}

template <class S>
const Mat<S>& run_channel_tail(const ChannelTail& tail, Mat<S>& a, Mat<S>& b) {
  Mat<S>* cur = &a;
  Mat<S>* other = &b;
  for (const TailStage& st : tail.stages) {
    switch (st.op) {
      case TailStage::Op::relu:
        *cur = cur->cwiseMax(S(0));
        break;
      case TailStage::Op::scalar_fn: {
        const pp_scalar_fn fn = st.layer->view->elementwise_fn;
        for (Eigen::Index i = 0; i < cur->size(); ++i)
          cur->data()[i] = static_cast<S>(fn(st.layer->ctx, static_cast<double>(cur->data()[i])));
        break;
      }
      case TailStage::Op::max_pool:
      case TailStage::Op::avg_pool:
        pool_rows(st, *cur, *other);
        std::swap(cur, other);
        break;
    }
  }
  return *cur;
}

template const Mat<float>& run_channel_tail<float>(const ChannelTail&, Mat<float>&, Mat<float>&);
template const Mat<double>& run_channel_tail<double>(const ChannelTail&, Mat<double>&,
                                                     Mat<double>&);

}  // namespace polyprobe::cpu_tbb
