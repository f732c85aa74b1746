// The incumbent cache and the layer forward it runs (incumbent_cache.hpp).
#include "incumbent_cache.hpp"

#include <polyprobe/plugin/plugin.hpp>

#include <tbb/parallel_for.h>

#include <algorithm>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace polyprobe::cpu_tbb {

namespace {

// forward_layer on `rows` sample-major rows at `in` into `out` (rows x layer.out, allocated).
template <class S>
void forward_rows(const LayerPlan& layer, const S* in, int64_t rows, const S* params, S* out,
                  bool host_only) {
  const Eigen::Map<const Mat<S>> x(in, rows, layer.in);
  Eigen::Map<Mat<S>> y(out, rows, layer.out);
  if (!host_only && layer.op == LayerOp::affine) {
    const Eigen::Map<const Mat<S>> w(params + layer.offset, layer.out, layer.in);
    y.noalias() = x * w.transpose();
    if (layer.has_bias)
      y.rowwise() += Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>(
          params + layer.offset + layer.weight_count, layer.out);
    return;
  }
  if (!host_only && layer.op == LayerOp::elementwise && layer.is_relu) {
    y = x.cwiseMax(S(0));
    return;
  }
  const int32_t dtype = pp::dtype_of<S>();
  const int64_t in_shape[2] = {rows, layer.in}, out_shape[2] = {rows, layer.out},
                p_shape[1] = {layer.count};
  pp_tensor tin{const_cast<S*>(in), dtype, PP_DEVICE_TYPE_CPU, 0, 2, in_shape, nullptr};
  pp_tensor tp{
      const_cast<S*>(params + layer.offset), dtype, PP_DEVICE_TYPE_CPU, 0, 1, p_shape, nullptr};
  pp_tensor tout{out, dtype, PP_DEVICE_TYPE_CPU, 0, 2, out_shape, nullptr};
  pp_error err{};
  if (layer.view->host_forward(layer.view->host_layer, &tin, &tp, &tout, &err) != PP_OK)
    throw std::runtime_error(std::string("layer '") + layer.view->kind + "': " + err.message);
}

// Rows per block of the incumbent's forward. Fixed, so the blocks (and every bit of the
// result) are the same for any thread count.
constexpr int64_t kIncumbentRows = 4;

// y = x W^T (R rows) from W^T's rows (wt, [in, out] row-major), a chunk of 4 packets of
// outputs at a time with the R x 4 sums in registers and each product fused into its sum, in
// input order; outputs past the last whole chunk from W's rows (w, [out, in]). Eigen's GEMM packs
// all of W again for each few-row block: on mnist128-sub256 the packing (gemm_pack_lhs, 10% of a
// step) cost more than the multiply-adds.
template <class S, int R>
void affine_rows(const S* x, int64_t in, const S* w, const S* wt, int64_t out, S* y) {
  using P = typename Eigen::internal::packet_traits<S>::type;
  constexpr int64_t lanes = Eigen::internal::packet_traits<S>::size, chunk = 4 * lanes;
  int64_t o0 = 0;
  for (; o0 + chunk <= out; o0 += chunk) {
    P acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = Eigen::internal::pset1<P>(S(0));
    for (int64_t k = 0; k < in; ++k) {
      const S* row = wt + k * out + o0;
      P wj[4];
      for (int j = 0; j < 4; ++j) wj[j] = Eigen::internal::ploadu<P>(row + j * lanes);
      for (int r = 0; r < R; ++r) {
        const P xr = Eigen::internal::pset1<P>(x[r * in + k]);
        for (int j = 0; j < 4; ++j) acc[r][j] = Eigen::internal::pmadd(xr, wj[j], acc[r][j]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 4; ++j) Eigen::internal::pstoreu(y + r * out + o0 + j * lanes, acc[r][j]);
  }
  // The last outputs (all of a classifier's ten) as dot products of x's and W's rows.
  for (; o0 < out; ++o0)
    for (int r = 0; r < R; ++r)
      y[r * out + o0] =
          Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>(x + r * in, in)
              .dot(Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>(w + o0 * in, in));
}

// An affine layer on a block of at most kIncumbentRows rows (see affine_rows).
template <class S>
void affine_block(const LayerPlan& layer, const S* in, int64_t rows, const Mat<S>& wt,
                  const S* params, S* out) {
  switch (rows) {
    case 1:
      affine_rows<S, 1>(in, layer.in, params + layer.offset, wt.data(), layer.out, out);
      break;
    case 2:
      affine_rows<S, 2>(in, layer.in, params + layer.offset, wt.data(), layer.out, out);
      break;
    case 3:
      affine_rows<S, 3>(in, layer.in, params + layer.offset, wt.data(), layer.out, out);
      break;
    default:
      affine_rows<S, 4>(in, layer.in, params + layer.offset, wt.data(), layer.out, out);
      break;
  }
  static_assert(kIncumbentRows == 4, "affine_block dispatches 1 to 4 rows");
  if (layer.has_bias)
    Eigen::Map<Mat<S>>(out, rows, layer.out).rowwise() +=
        Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>(
            params + layer.offset + layer.weight_count, layer.out);
}

// The incumbent's forward in blocks of kIncumbentRows rows on the current task arena's
// threads, each block through every layer in one task: the incumbent's forward is the one
// serial part of a step otherwise (a conv on the whole batch). One fork-join serves the
// whole model, and a block's activations are still in cache for its next layer; affine
// layers read their W^T (weights_t) through affine_block, the others run forward_rows.
template <class S>
void forward_model_blocked(const ModelPlan& plan, std::vector<Mat<S>>& acts,
                           const std::vector<Mat<S>>& weights_t, const S* params) {
  const int64_t n = acts[0].rows();
  for (std::size_t l = 0; l < plan.layers.size(); ++l) acts[l + 1].resize(n, plan.layers[l].out);
  const int64_t blocks = (n + kIncumbentRows - 1) / kIncumbentRows;
  tbb::parallel_for(int64_t{0}, blocks, [&](int64_t b) {
    const int64_t begin = b * kIncumbentRows, rows = std::min(kIncumbentRows, n - begin);
    for (std::size_t l = 0; l < plan.layers.size(); ++l) {
      const LayerPlan& layer = plan.layers[l];
      const S* in = acts[l].data() + begin * layer.in;
      S* out = acts[l + 1].data() + begin * layer.out;
      if (layer.op == LayerOp::affine)
        affine_block(layer, in, rows, weights_t[l], params, out);
      else
        forward_rows(layer, in, rows, params, out, false);
    }
  });
}

}  // namespace

template <class S>
void forward_layer(const LayerPlan& layer, const Mat<S>& in, const S* params, Mat<S>& out,
                   bool host_only) {
  out.resize(in.rows(), layer.out);
  forward_rows(layer, in.data(), in.rows(), params, out.data(), host_only);
}

template <class S>
const Mat<S>& forward_suffix(const ModelPlan& plan, std::size_t from, const Mat<S>& in,
                             const S* params, std::vector<Mat<S>>& outputs) {
  outputs.resize(plan.layers.size());
  const Mat<S>* h = &in;
  for (std::size_t m = from; m < plan.layers.size(); ++m) {
    forward_layer(plan.layers[m], *h, params, outputs[m]);
    h = &outputs[m];
  }
  return *h;
}

template <class S>
void IncumbentCache<S>::set_batch(const pp_batch_view& view, int64_t in_features) {
  const auto inputs = pp::as_span<const double>(view.inputs);
  const int64_t rows = pp::rows(view.inputs), cols = pp::row_size(view.inputs);
  if (rows <= 0) throw std::invalid_argument("cannot register an empty batch");
  if (cols != in_features)
    throw std::invalid_argument("batch has " + std::to_string(cols) +
                                " features, the model expects " + std::to_string(in_features));
  x = Eigen::Map<const Mat<double>>(inputs.data(), rows, cols).template cast<S>();
  batch = rows;
  ready = false;  // the prefix activations belong to the old batch
  labels.clear();
  targets.clear();
  if (view.labels.data != nullptr) {
    const auto given = pp::as_span<const int64_t>(view.labels);
    labels.assign(given.begin(), given.end());
  }
  if (view.targets.data != nullptr) {
    const auto given = pp::as_span<const double>(view.targets);
    targets.assign(given.begin(), given.end());
  }
}

template <class S>
S IncumbentCache<S>::effective(const ModelPlan& plan, int64_t param, double raw) const {
  // As the forward sees it: the parameter in S, then the layer's transform.
  const S value = static_cast<S>(raw);
  if (plan.owners.empty()) return value;
  const LayerPlan& layer = plan.layers[static_cast<std::size_t>(plan.layer_of(param))];
  if (layer.op != LayerOp::affine) return value;  // host layers apply their own transforms
  const pp_scalar_fn q = param - layer.offset < layer.weight_count ? layer.weight_q : layer.bias_q;
  return q == nullptr ? value : static_cast<S>(q(layer.ctx, static_cast<double>(value)));
}

template <class S>
void IncumbentCache<S>::set_base(const ModelPlan& plan, const double* values) {
  const auto n = static_cast<std::size_t>(plan.n_params);
  base = std::span<const double>(values, n);
  eff.resize(n);
  // Vectorised: this runs once per call over every parameter, and on small candidate sets
  // (subspace steps) it is a visible share of the call.
  const Eigen::Map<const Eigen::VectorXd> all(values, plan.n_params);
  base_sq = all.squaredNorm();
  Eigen::Map<Eigen::Matrix<S, Eigen::Dynamic, 1>>(eff.data(), plan.n_params) =
      all.template cast<S>();
  // Transforms, layer by layer (no owner lookup per parameter).
  for (const LayerPlan& layer : plan.layers) {
    if (layer.op != LayerOp::affine || (layer.weight_q == nullptr && layer.bias_q == nullptr))
      continue;
    for (int64_t i = 0; i < layer.count; ++i) {
      const pp_scalar_fn q = i < layer.weight_count ? layer.weight_q : layer.bias_q;
      S& e = eff[static_cast<std::size_t>(layer.offset + i)];
      if (q != nullptr) e = static_cast<S>(q(layer.ctx, static_cast<double>(e)));
    }
  }
  ++generation;
}

template <class S>
void IncumbentCache<S>::transpose_from(std::size_t first) {
  // In blocks of features across the layers: one conv layer's activations (64 x 12,544
  // values) are most of the work, so a task per layer left it on one thread (1.8 ms of a
  // 13.6 ms cnn step at 16 threads).
  constexpr int64_t kFeatureBlock = 256;
  std::vector<std::pair<std::size_t, int64_t>> blocks;  // (layer, first feature)
  for (std::size_t l = first; l < transposed_from && l < acts.size(); ++l) {
    acts_t[l].resize(acts[l].cols(), acts[l].rows());
    for (int64_t f = 0; f < acts[l].cols(); f += kFeatureBlock) blocks.emplace_back(l, f);
  }
  tbb::parallel_for(std::size_t{0}, blocks.size(), [&](std::size_t i) {
    const auto [l, f] = blocks[i];
    const int64_t n = std::min(kFeatureBlock, acts[l].cols() - f);
    acts_t[l].middleRows(f, n) = acts[l].middleCols(f, n).transpose();
  });
  transposed_from = std::min(transposed_from, first);
}

template <class S>
void IncumbentCache<S>::refresh(const ModelPlan& plan, const double* values,
                                uint64_t incumbent_version, kernels::LossKind loss, double l2,
                                DirectionProjections<S>& projections) {
  set_base(plan, values);
  version = incumbent_version;
  ready = true;
  const std::size_t n_layers = plan.layers.size();
  acts.resize(n_layers + 1);
  acts_t.resize(n_layers + 1);
  weights_t.resize(n_layers);
  for (std::size_t l = 0; l < n_layers; ++l) {
    const LayerPlan& layer = plan.layers[l];
    if (layer.op == LayerOp::affine)
      weights_t[l] =
          Eigen::Map<const Mat<S>>(eff.data() + layer.offset, layer.out, layer.in).transpose();
  }
  acts[0] = x;
  forward_model_blocked(plan, acts, weights_t, eff.data());
  transposed_from = n_layers + 1;  // acts_t keep their memory: the next call's sizes are these
  transpose_from(n_layers);
  projections.compute(plan, acts, v_src);
  base_loss = rows_loss(loss, acts.back(), 0) + l2 * base_sq;
  if (loss == kernels::LossKind::cross_entropy) {
    const Mat<S>& z = acts_t.back();
    probs_t.resize(z.rows(), batch);
    one_hot_t.setZero(z.rows(), batch);
    sample_loss.resize(batch);
    for (int64_t b = 0; b < batch; ++b) {
      const S m = z.col(b).maxCoeff();
      probs_t.col(b) = (z.col(b).array() - m).exp().matrix();
      const S total = probs_t.col(b).sum();
      probs_t.col(b) /= total;
      const int64_t y = labels[static_cast<std::size_t>(b)];
      one_hot_t(y, b) = S(1);
      sample_loss(b) = m + std::log(total) - z(y, b);
    }
    const int64_t classes = z.rows();
    if (classes <= kOthersClasses) {
      others_t.resize(classes, batch);
      for (int64_t k = 0; k < classes; ++k) {
        others_t.row(k).setZero();
        for (int64_t c = 0; c < classes; ++c)
          if (c != k) others_t.row(k) += probs_t.row(c);
      }
    }
  }
}

template <class S>
double IncumbentCache<S>::rows_loss(kernels::LossKind loss, const Mat<S>& out,
                                    int64_t first_row) const {
  double sum = 0.0;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t label = labels.empty() ? 0 : labels[static_cast<std::size_t>(r)];
    const double* target = targets.empty() ? nullptr : targets.data() + r * out.cols();
    sum += static_cast<double>(
        kernels::loss_row<S>(loss, out.row(first_row + r).data(), out.cols(), label, target));
  }
  return sum / static_cast<double>(batch);
}

template struct IncumbentCache<float>;
template struct IncumbentCache<double>;
template void forward_layer<float>(const LayerPlan&, const Mat<float>&, const float*, Mat<float>&,
                                   bool);
template void forward_layer<double>(const LayerPlan&, const Mat<double>&, const double*,
                                    Mat<double>&, bool);
template const Mat<float>& forward_suffix<float>(const ModelPlan&, std::size_t, const Mat<float>&,
                                                 const float*, std::vector<Mat<float>>&);
template const Mat<double>& forward_suffix<double>(const ModelPlan&, std::size_t,
                                                   const Mat<double>&, const double*,
                                                   std::vector<Mat<double>>&);

}  // namespace polyprobe::cpu_tbb
