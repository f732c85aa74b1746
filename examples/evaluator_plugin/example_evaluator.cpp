// A complete, small evaluator backend: scores candidates on the CPU, one at a time, with
// nothing but the plugin SDK. Each candidate is materialised (the incumbent's parameters
// with its particle moved) and run forward through every layer from the first one it
// changes; the incumbent's activations before that layer are computed once and cached
// until the batch or the incumbent changes. It runs every layer through the host's own CPU
// forward (pp_layer_view::host_forward), so it serves every model the host can build.
#include <polyprobe/plugin/kernels/losses.hpp>
#include <polyprobe/plugin/kernels/subspace_move.hpp>
#include <polyprobe/plugin/plugin.hpp>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace kernels = polyprobe::kernels;

int64_t features(int32_t ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int32_t i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

// Why this backend cannot serve a request; empty when it can.
std::string unsupported_reason(const char* path, const pp_model_view& model,
                               const pp_loss_view& loss, const pp_session_options& options) {
  if (path != nullptr && std::string(path) != "auto" && std::string(path) != "materialised")
    return "unknown path '" + std::string(path) + "' (paths: auto, materialised)";
  if (options.device != PP_DEVICE_TYPE_CPU) return "it runs on the cpu only";
  if (options.dtype != PP_DTYPE_F32 && options.dtype != PP_DTYPE_F64)
    return std::string("it computes in float32 or float64, not ") + pp::dtype_name(options.dtype);
  if (PP_HAS_FIELD(&options, pp_session_options, candidate_dtype) && options.candidate_dtype != 0)
    return "it has no reduced-precision candidates (candidate_autocast)";
  if (kernels::loss_kind(loss.name) == kernels::LossKind::unknown)
    return "unknown loss '" + std::string(loss.name != nullptr ? loss.name : "") + "'";
  for (int32_t i = 0; i < model.n_layers; ++i)
    if (model.layers[i].host_forward == nullptr)
      return "layer " + std::to_string(i) + " (" + model.layers[i].kind + ") has no CPU forward";
  return "";
}

// One session: the model's structure, the batch, the particles and the incumbent. S is the
// compute precision (float or double); parameters and moves are kept in double, as the host
// keeps them, so the incumbent moves with the host's arithmetic.
template <class S>
class Session {
 public:
  Session(const pp_model_view& model, const pp_loss_view& loss, const pp_session_options& options)
      : model_(model),
        loss_kind_(kernels::loss_kind(loss.name)),
        l2_(loss.l2),
        subspace_(options.subspace) {}

  void set_batch(const pp_batch_view& batch) {
    rows_ = batch.inputs.shape[0];
    const auto inputs = pp::as_span<const double>(batch.inputs);
    input_.assign(inputs.begin(), inputs.end());
    labels_.clear();
    targets_.clear();
    if (batch.labels.data != nullptr) {
      const auto labels = pp::as_span<const int64_t>(batch.labels);
      labels_.assign(labels.begin(), labels.end());
    }
    if (batch.targets.data != nullptr) {
      const auto targets = pp::as_span<const double>(batch.targets);
      targets_.assign(targets.begin(), targets.end());
    }
    cache_valid_ = false;
  }

  void set_particles(const pp_particle_layout& layout) {
    d_ = layout.d;
    coords_.assign(layout.coords, layout.coords + layout.n_particles * layout.d);
    n_vertices_ = layout.n_vertices;
    n_probes_ = layout.n_probes;
  }

  void set_incumbent(const pp_tensor& theta) {
    const auto values = pp::as_span<const double>(theta);
    if (static_cast<int64_t>(values.size()) != model_.n_params)
      throw std::invalid_argument("incumbent has " + std::to_string(values.size()) +
                                  " parameters, the model " + std::to_string(model_.n_params));
    incumbent_.assign(values.begin(), values.end());
    candidate_ = incumbent_;
    cache_valid_ = false;
  }

  void move_incumbent(const double* moves) {
    for (std::size_t c = 0; c < coords_.size(); ++c) move(incumbent_, coords_[c], moves[c]);
    candidate_ = incumbent_;
    cache_valid_ = false;
  }

  void score(const pp_score_request& request, double* losses, double* incumbent_loss) {
    if (input_.empty()) throw std::logic_error("score before set_batch");
    if (incumbent_.empty()) throw std::logic_error("score before set_incumbent");
    refresh_cache();
    if (incumbent_loss != nullptr) *incumbent_loss = incumbent_objective_;
    if (request.form == PP_CANDIDATES_EXPLICIT) {
      for (int64_t c = 0; c < request.count; ++c)
        losses[c] = candidate_loss(request.particle[c], request.displacement + c * d_);
    } else if (request.form == PP_CANDIDATES_POLYTOPE) {
      score_polytope(request, losses);
    } else {
      throw std::invalid_argument("unknown candidate form " + std::to_string(request.form));
    }
  }

  void read_incumbent(pp_tensor& theta) const {
    const auto out = pp::as_span<double>(theta);
    std::copy(incumbent_.begin(), incumbent_.end(), out.begin());
  }

  const char* explain() {
    explanation_ = R"({"path": "materialised", "incumbent_cached": true, "candidates_scored": )" +
                   std::to_string(scored_) + "}";
    return explanation_.c_str();
  }

 private:
  // Particle i at vertex v and probe k moves by probe_radius * k / (K + 1) * directions[i, v].
  void score_polytope(const pp_score_request& request, double* losses) {
    if (losses == nullptr)
      throw std::invalid_argument("losses is NULL (this backend has no transport)");
    const int64_t n_particles = static_cast<int64_t>(coords_.size()) / d_;
    std::vector<double> step(static_cast<std::size_t>(d_));
    for (int64_t i = 0; i < n_particles; ++i) {
      if (request.active != nullptr && request.active[i] == 0) continue;
      for (int32_t v = 0; v < n_vertices_; ++v) {
        const double* direction = request.directions + (i * n_vertices_ + v) * d_;
        for (int32_t k = 1; k <= n_probes_; ++k) {
          const double scale = request.probe_radius * k / (n_probes_ + 1);
          for (int32_t j = 0; j < d_; ++j) step[static_cast<std::size_t>(j)] = scale * direction[j];
          losses[(i * n_vertices_ + v) * n_probes_ + (k - 1)] = candidate_loss(i, step.data());
        }
      }
    }
  }

  // Moves `params` by theta along search coordinate `coord` (-1 = padding).
  void move(std::vector<double>& params, int64_t coord, double theta) const {
    if (coord < 0) return;
    if (subspace_ == nullptr)
      params[static_cast<std::size_t>(coord)] += theta;
    else
      kernels::apply_subspace_move(subspace_->coords[coord], theta, params.data());
  }

  // The parameter range [first, last) that moving `coord` touches.
  std::pair<int64_t, int64_t> touched(int64_t coord) const {
    if (subspace_ == nullptr) return {coord, coord + 1};
    const pp_subspace_coord& c = subspace_->coords[coord];
    return {c.offset, c.offset + c.rows * c.cols};
  }

  // The loss of the incumbent with particle p moved by step[0 .. d).
  double candidate_loss(int64_t p, const double* step) {
    int64_t first = model_.n_params;
    for (int32_t j = 0; j < d_; ++j) {
      const int64_t coord = coords_[static_cast<std::size_t>(p * d_ + j)];
      if (coord < 0) continue;
      move(candidate_, coord, step[j]);
      first = std::min(first, touched(coord).first);
    }
    const double loss = objective(candidate_, first_changed_layer(first));
    for (int32_t j = 0; j < d_; ++j) {  // back to the incumbent, exactly
      const int64_t coord = coords_[static_cast<std::size_t>(p * d_ + j)];
      if (coord < 0) continue;
      const auto [lo, hi] = touched(coord);
      std::copy(incumbent_.begin() + lo, incumbent_.begin() + hi, candidate_.begin() + lo);
    }
    ++scored_;
    return loss;
  }

  // The first layer whose parameters include index `param` (the last layer when none do).
  int32_t first_changed_layer(int64_t param) const {
    for (int32_t i = 0; i < model_.n_layers; ++i) {
      const pp_layer_view& layer = model_.layers[i];
      if (param < layer.param_offset + layer.param_count) return i;
    }
    return model_.n_layers - 1;
  }

  // Runs layer i on `in` with its parameters from `params` into `out`.
  void forward(int32_t i, const std::vector<S>& in, const std::vector<double>& params,
               std::vector<S>& out) {
    const pp_layer_view& layer = model_.layers[i];
    const int64_t n_in = features(layer.in_ndim, layer.in_shape);
    const int64_t n_out = features(layer.out_ndim, layer.out_shape);
    layer_params_.assign(params.begin() + layer.param_offset,
                         params.begin() + layer.param_offset + layer.param_count);
    out.resize(static_cast<std::size_t>(rows_ * n_out));
    const int64_t in_shape[2] = {rows_, n_in}, out_shape[2] = {rows_, n_out};
    const int64_t param_shape[1] = {layer.param_count};
    const int32_t dtype = pp::dtype_of<S>();
    pp_tensor x{const_cast<S*>(in.data()), dtype, PP_DEVICE_TYPE_CPU, 0, 2, in_shape, nullptr};
    pp_tensor p{layer_params_.data(), dtype, PP_DEVICE_TYPE_CPU, 0, 1, param_shape, nullptr};
    pp_tensor y{out.data(), dtype, PP_DEVICE_TYPE_CPU, 0, 2, out_shape, nullptr};
    pp_error err{};
    if (layer.host_forward(layer.host_layer, &x, &p, &y, &err) != PP_OK)
      throw std::runtime_error("layer " + std::to_string(i) + " (" + layer.kind +
                               "): " + err.message);
  }

  // mean per-sample loss + l2 * sum(params^2), running the layers from `first` on: the
  // activations before it are the incumbent's.
  double objective(const std::vector<double>& params, int32_t first) {
    const std::vector<S>* in = &activations_[static_cast<std::size_t>(first)];
    for (int32_t i = first; i < model_.n_layers; ++i) {
      std::vector<S>& out = scratch_[static_cast<std::size_t>(i % 2)];
      forward(i, *in, params, out);
      in = &out;
    }
    const pp_layer_view& last = model_.layers[model_.n_layers - 1];
    const int64_t n_out = features(last.out_ndim, last.out_shape);
    double sum = 0;
    for (int64_t r = 0; r < rows_; ++r)
      sum += static_cast<double>(kernels::loss_row<S>(
          loss_kind_, in->data() + r * n_out, n_out, labels_.empty() ? 0 : labels_[r],
          targets_.empty() ? nullptr : targets_.data() + r * n_out));
    double value = sum / static_cast<double>(rows_);
    if (l2_ != 0) {
      double squares = 0;
      for (double w : params) squares += w * w;
      value += l2_ * squares;
    }
    return value;
  }

  // The incumbent's activations at every layer's input, and its objective.
  void refresh_cache() {
    if (cache_valid_) return;
    activations_.resize(static_cast<std::size_t>(model_.n_layers));
    activations_[0].assign(input_.begin(), input_.end());
    for (int32_t i = 0; i + 1 < model_.n_layers; ++i)
      forward(i, activations_[static_cast<std::size_t>(i)], incumbent_,
              activations_[static_cast<std::size_t>(i + 1)]);
    incumbent_objective_ = objective(incumbent_, 0);
    cache_valid_ = true;
  }

  const pp_model_view& model_;  // valid for the session's life (abi.h)
  kernels::LossKind loss_kind_;
  double l2_;
  const pp_subspace_view* subspace_;
  int64_t rows_ = 0;
  std::vector<double> input_, targets_;
  std::vector<int64_t> labels_;
  int32_t d_ = 1, n_vertices_ = 0, n_probes_ = 1;
  std::vector<int64_t> coords_;
  std::vector<double> incumbent_, candidate_;
  bool cache_valid_ = false;
  std::vector<std::vector<S>> activations_;  // [layer]: the incumbent's input to that layer
  double incumbent_objective_ = 0;
  std::vector<S> scratch_[2], layer_params_;
  int64_t scored_ = 0;
  std::string explanation_;
};

int supports(const char* path, const pp_model_view* model, const pp_loss_view* loss,
             const pp_session_options* options, pp_error* why) {
  return pp::answer_supports(why,
                             [&] { return unsupported_reason(path, *model, *loss, *options); });
}

int create(const pp_model_view* model, const pp_loss_view* loss, const pp_session_options* options,
           void** self, const pp_session_api** api, pp_error* err) {
  return pp::guard(err, [&] {
    const std::string reason = unsupported_reason(options->path, *model, *loss, *options);
    if (!reason.empty()) throw std::invalid_argument(reason);
    if (options->dtype == PP_DTYPE_F32)
      pp::hand_over_session(std::make_unique<Session<float>>(*model, *loss, *options), self, api);
    else
      pp::hand_over_session(std::make_unique<Session<double>>(*model, *loss, *options), self, api);
  });
}

constexpr uint32_t kFloats = PP_DTYPE_BIT(PP_DTYPE_F32) | PP_DTYPE_BIT(PP_DTYPE_F64);
const pp_capability kCaps[] = {
    {PP_COMPONENT_EVALUATOR, "materialised", PP_DEVICE_TYPE_CPU, PP_DEVICE_NAME_CPU, kFloats, 0,
     "each candidate's parameters materialised and run forward from the first layer it "
     "changes, the incumbent's activations cached"},
};

const pp_plugin kPlugin = [] {
  pp_plugin p{};
  p.api_version = PP_PLUGIN_API_VERSION;
  p.struct_size = sizeof(pp_plugin);
  p.name = "example_evaluator";
  p.version = "1.0.0";
  p.vendor = "example";
  p.summary = "a plain CPU evaluator: materialised candidates, the incumbent cached";
  p.probe = nullptr;  // usable everywhere, with the lowest score: chosen with --backend
  p.caps = kCaps;
  p.n_caps = 1;
  p.session_supports = &supports;
  p.session_create = &create;
  return p;
}();

}  // namespace

POLYPROBE_PLUGIN_EXPORT const pp_plugin* polyprobe_plugin_entry(uint32_t host_api_version) {
  return host_api_version == PP_PLUGIN_API_VERSION ? &kPlugin : nullptr;
}
