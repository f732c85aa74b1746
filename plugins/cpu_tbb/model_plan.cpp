#include "model_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>

namespace polyprobe::cpu_tbb {
namespace {

int64_t numel(int32_t ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int32_t i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool close(double a, double b, double tol) { return std::abs(a - b) <= tol * (1.0 + std::abs(b)); }

// Probe inputs: ordinary values, exact zeros, kink and step points, large magnitudes.
std::vector<double> probe_values(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> gauss(0.0, 1.5);
  std::vector<double> x(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    switch (i % 7) {
      case 3:
        x[static_cast<std::size_t>(i)] = 0.0;
        break;
      case 5:
        x[static_cast<std::size_t>(i)] =
            0.25 * static_cast<double>(static_cast<int>(gauss(rng) * 4));
        break;
      case 6:
        x[static_cast<std::size_t>(i)] = 12.0 * gauss(rng);
        break;
      default:
        x[static_cast<std::size_t>(i)] = gauss(rng);
        break;
    }
  }
  return x;
}

// Empty when y = x Q(W)^T + Qb(b) holds on a random probe, else why not.
std::string probe_affine(const LayerPlan& layer) {
  const pp_layer_view& v = *layer.view;
  if (v.in_ndim != 1) return "declared affine over a " + std::to_string(v.in_ndim) + "-D sample";
  if (layer.count != layer.weight_count && layer.count != layer.weight_count + layer.out)
    return "declared affine with " + std::to_string(layer.count) +
           " parameters, not out*in (+ out) = " + std::to_string(layer.weight_count);
  std::mt19937_64 rng(0x5eed);
  std::normal_distribution<double> gauss(0.0, 0.5);
  const int64_t rows = 3;
  std::vector<double> params(static_cast<std::size_t>(layer.count)),
      x = probe_values(rows * layer.in, rng), y;
  for (double& p : params) p = gauss(rng);
  if (std::string why = host_forward(layer, x, rows, params, y); !why.empty()) return why;
  auto q = [&](pp_scalar_fn fn, double w) { return fn == nullptr ? w : fn(layer.ctx, w); };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < layer.out; ++o) {
      double expect =
          layer.has_bias ? q(layer.bias_q, params[static_cast<std::size_t>(layer.weight_count + o)])
                         : 0.0;
      for (int64_t i = 0; i < layer.in; ++i)
        expect += x[static_cast<std::size_t>(r * layer.in + i)] *
                  q(layer.weight_q, params[static_cast<std::size_t>(o * layer.in + i)]);
      if (!close(y[static_cast<std::size_t>(r * layer.out + o)], expect, 1e-9))
        return "declared affine, but its forward differs from x Q(W)^T + Qb(b) on a probe "
               "(output " +
               std::to_string(o) + ": " +
               std::to_string(y[static_cast<std::size_t>(r * layer.out + o)]) + " vs " +
               std::to_string(expect) + ")";
    }
  return {};
}

// Empty when the layer acts elementwise on a probe (and matches its declared f), else why.
std::string probe_elementwise(LayerPlan& layer) {
  if (layer.count != 0) return "declared elementwise but has parameters";
  if (layer.in != layer.out) return "declared elementwise but changes the feature count";
  std::mt19937_64 rng(0xe1e);
  const int64_t rows = 4, n = rows * layer.in;
  const std::vector<double> x = probe_values(n, rng), none;
  std::vector<double> y, y_perm;
  if (std::string why = host_forward(layer, x, rows, none, y); !why.empty()) return why;
  const pp_scalar_fn fn = layer.view->elementwise_fn;
  if (fn != nullptr)
    for (int64_t i = 0; i < n; ++i)
      if (!close(y[static_cast<std::size_t>(i)], fn(layer.ctx, x[static_cast<std::size_t>(i)]),
                 1e-9))
        return "declared elementwise, but its forward differs from its declared f at x = " +
               std::to_string(x[static_cast<std::size_t>(i)]);
  // Moving inputs around must move outputs the same way: the fast paths evaluate f on
  // buffers laid out differently from a batch of samples.
  std::vector<int64_t> perm(static_cast<std::size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<double> x_perm(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x_perm[static_cast<std::size_t>(i)] =
        x[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])];
  if (std::string why = host_forward(layer, x_perm, rows, none, y_perm); !why.empty()) return why;
  for (int64_t i = 0; i < n; ++i)
    if (!close(y_perm[static_cast<std::size_t>(i)],
               y[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])], 1e-12))
      return "declared elementwise, but its output depends on where a value sits (permutation "
             "probe)";
  layer.is_relu = true;
  for (int64_t i = 0; i < n && layer.is_relu; ++i)
    layer.is_relu = y[static_cast<std::size_t>(i)] == std::max(x[static_cast<std::size_t>(i)], 0.0);
  return {};
}

}  // namespace

std::string host_forward(const LayerPlan& layer, const std::vector<double>& x, int64_t rows,
                         const std::vector<double>& params, std::vector<double>& y) {
  if (layer.view->host_forward == nullptr) return "it has no host forward to probe";
  y.assign(static_cast<std::size_t>(rows * layer.out), 0.0);
  const int64_t in_shape[2] = {rows, layer.in}, out_shape[2] = {rows, layer.out},
                p_shape[1] = {static_cast<int64_t>(params.size())};
  pp_tensor tin{
      const_cast<double*>(x.data()), PP_DTYPE_F64, PP_DEVICE_TYPE_CPU, 0, 2, in_shape, nullptr};
  pp_tensor tp{
      const_cast<double*>(params.data()), PP_DTYPE_F64, PP_DEVICE_TYPE_CPU, 0, 1, p_shape, nullptr};
  pp_tensor tout{y.data(), PP_DTYPE_F64, PP_DEVICE_TYPE_CPU, 0, 2, out_shape, nullptr};
  pp_error err{};
  if (layer.view->host_forward(layer.view->host_layer, &tin, &tp, &tout, &err) != PP_OK)
    return std::string("its forward failed on the probe: ") + err.message;
  return {};
}

int32_t ModelPlan::layer_of(int64_t param) const {
  auto it =
      std::upper_bound(owners.begin(), owners.end(), std::pair<int64_t, int32_t>{param, INT32_MAX});
  if (it == owners.begin())
    throw std::out_of_range("parameter " + std::to_string(param) + " has no layer");
  return std::prev(it)->second;
}

int64_t ModelPlan::max_width() const {
  int64_t w = in_features;
  for (const LayerPlan& l : layers) w = std::max(w, l.out);
  return w;
}

const char* op_name(LayerOp op) {
  switch (op) {
    case LayerOp::affine:
      return "affine";
    case LayerOp::elementwise:
      return "elementwise";
    case LayerOp::host:
      return "host";
  }
  return "host";
}

ModelPlan build_model_plan(const pp_model_view& model) {
  ModelPlan plan;
  plan.n_params = model.n_params;
  plan.in_features = numel(model.in_ndim, model.in_shape);
  plan.out_features = plan.in_features;
  for (int32_t i = 0; i < model.n_layers; ++i) {
    const pp_layer_view& v = model.layers[i];
    LayerPlan l;
    l.view = &v;
    l.in = numel(v.in_ndim, v.in_shape);
    l.out = numel(v.out_ndim, v.out_shape);
    l.offset = v.param_offset;
    l.count = v.param_count;
    l.ctx = v.fn_ctx;
    if ((v.contract & PP_CONTRACT_AFFINE) != 0) {
      l.weight_count = l.in * l.out;
      l.has_bias = l.count == l.weight_count + l.out;
      l.weight_q = v.weight_transform;
      l.bias_q = v.bias_transform;
      l.probe_note = probe_affine(l);
      if (l.probe_note.empty()) l.op = LayerOp::affine;
    } else if ((v.contract & PP_CONTRACT_ELEMENTWISE) != 0) {
      l.probe_note = probe_elementwise(l);
      if (l.probe_note.empty())
        l.op = LayerOp::elementwise;
      else
        l.is_relu = false;
    }
    if ((v.contract & PP_CONTRACT_PREFIX_REUSABLE) == 0 && plan.no_prefix_reuse.empty())
      plan.no_prefix_reuse = "layer " + std::to_string(i) + " (" + v.kind +
                             ") is not prefix-reusable: its output may depend on more than its "
                             "input and own parameters";
    if (l.count > 0) plan.owners.emplace_back(l.offset, i);
    plan.out_features = l.out;
    plan.layers.push_back(std::move(l));
  }
  return plan;
}

}  // namespace polyprobe::cpu_tbb
