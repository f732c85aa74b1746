#include "dense_evaluator.hpp"

#include <polyprobe/kernels/losses.hpp>
#include <polyprobe/plugin.hpp>

#include <Eigen/Core>
#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace polyprobe::cpu_tbb {
namespace {

template <class S>
using Matrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

enum class Op { linear, relu, host };

// How one layer of the model runs here.
struct LayerStep {
  Op op;
  const pp_layer_view* view;
  int64_t in, out;  // features per sample
  int64_t offset, count;
  int64_t weight_count;  // linear: out * in
  pp_scalar_fn weight_q, bias_q;
  const void* ctx;
};

bool is(const char* a, const char* b) { return a != nullptr && std::strcmp(a, b) == 0; }

int64_t numel(int32_t ndim, const int64_t* shape) {
  int64_t n = 1;
  for (int32_t i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

std::vector<LayerStep> plan_layers(const pp_model_view& model) {
  std::vector<LayerStep> steps;
  for (int32_t i = 0; i < model.n_layers; ++i) {
    const pp_layer_view& v = model.layers[i];
    LayerStep s{Op::host, &v, numel(v.in_ndim, v.in_shape), numel(v.out_ndim, v.out_shape),
                v.param_offset, v.param_count, 0, nullptr, nullptr, v.fn_ctx};
    // Only the core's own kinds are run natively; anything else goes through the host's
    // forward, which is always correct.
    if (is(v.kind, "linear") && v.in_ndim == 1 && (v.contract & PP_CONTRACT_AFFINE) != 0) {
      s.op = Op::linear;
      s.weight_count = s.in * s.out;
      s.weight_q = v.weight_transform;
      s.bias_q = v.bias_transform;
    } else if (is(v.kind, "relu")) {
      s.op = Op::relu;
    }
    steps.push_back(s);
  }
  return steps;
}

template <class S>
class DenseEvaluatorImpl final : public DenseEvaluator {
 public:
  DenseEvaluatorImpl(const pp_model_view& model, const pp_loss_view& loss,
                     const pp_eval_options& options)
      : steps_(plan_layers(model)),
        n_params_(model.n_params),
        loss_(kernels::loss_kind(loss.name)),
        l2_(loss.l2),
        threads_(options.threads) {
    // Which layer owns each parameter, for mapping a particle's coordinates to layers.
    for (std::size_t l = 0; l < steps_.size(); ++l)
      if (steps_[l].count > 0) owner_starts_.push_back({steps_[l].offset, l});
  }

  void register_batch(const pp_batch_view& batch) override {
    const auto inputs = pp::as_span<const double>(batch.inputs);
    const int64_t rows = pp::rows(batch.inputs), cols = pp::row_size(batch.inputs);
    x_ = Eigen::Map<const Matrix<double>>(inputs.data(), rows, cols).template cast<S>();
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
  }

  void evaluate(const pp_candidates& c, double* losses) override {
    if (x_.rows() == 0) throw std::logic_error("evaluate() before register_batch()");
    if (c.n_params != n_params_)
      throw std::invalid_argument("base parameter vector has " + std::to_string(c.n_params) +
                                  " entries, the model has " + std::to_string(n_params_));
    set_base(c.base_params);
    forward_prefix();
    if (c.count == 0) {
      losses[0] = mean_loss(acts_.back(), 0) + l2_ * base_sq_;
      return;
    }
    // Runs of candidates moving the same particle form a group.
    std::vector<int64_t> group_starts;
    for (int64_t i = 0; i < c.count; ++i)
      if (i == 0 || c.particle[i] != c.particle[i - 1]) group_starts.push_back(i);
    group_starts.push_back(c.count);

    auto body = [&](const tbb::blocked_range<std::size_t>& range) {
      Scratch& scratch = scratch_.local();
      if (scratch.eff.size() != eff_.size() || scratch.generation != generation_) {
        scratch.eff = eff_;
        scratch.generation = generation_;
      }
      for (std::size_t g = range.begin(); g != range.end(); ++g)
        evaluate_group(c, group_starts[g], group_starts[g + 1], scratch, losses);
    };
    const tbb::blocked_range<std::size_t> all(0, group_starts.size() - 1);
    if (threads_ > 0) {
      tbb::task_arena arena(threads_);
      arena.execute([&] { tbb::parallel_for(all, body); });
    } else {
      tbb::parallel_for(all, body);
    }
  }

  const char* explain() override {
    std::string text = R"({"path":"dense","dtype":")";
    text += std::is_same_v<S, float> ? "float32" : "float64";
    text += R"(","threads":)" + std::to_string(threads_) + R"(,"layers":[)";
    for (std::size_t l = 0; l < steps_.size(); ++l) {
      const char* how = steps_[l].op == Op::linear ? "gemm" : steps_[l].op == Op::relu ? "relu" : "host forward";
      text += std::string(l ? "," : "") + R"({"kind":")" + steps_[l].view->kind + R"(","how":")" + how + "\"}";
    }
    text += "]}";
    explain_ = text;
    return explain_.c_str();
  }

 private:
  struct Scratch {
    std::vector<S> eff;
    uint64_t generation = 0;
    std::vector<Matrix<S>> hidden;
    Matrix<S> stack, next;
    std::vector<S> row_losses;
  };

  // The effective parameters: Q applied to transformed weights, everything in S.
  void set_base(const double* base) {
    base_.assign(base, base + n_params_);
    eff_.resize(static_cast<std::size_t>(n_params_));
    base_sq_ = 0.0;
    for (int64_t i = 0; i < n_params_; ++i) {
      base_sq_ += base[i] * base[i];
      eff_[static_cast<std::size_t>(i)] = effective(i, base[i]);
    }
    ++generation_;
  }

  std::size_t layer_of(int64_t coord) const {
    auto it = std::upper_bound(owner_starts_.begin(), owner_starts_.end(),
                               std::pair<int64_t, std::size_t>{coord, steps_.size()});
    return std::prev(it)->second;
  }

  // The value the forward uses for raw parameter value `raw` at `coord`.
  S effective(int64_t coord, double raw) const {
    const S value = static_cast<S>(raw);
    if (owner_starts_.empty()) return value;
    const LayerStep& s = steps_[layer_of(coord)];
    if (s.op != Op::linear) return value;
    const bool is_weight = coord - s.offset < s.weight_count;
    const pp_scalar_fn q = is_weight ? s.weight_q : s.bias_q;
    return q == nullptr ? value : static_cast<S>(q(s.ctx, static_cast<double>(value)));
  }

  void forward_layer(const LayerStep& s, const Matrix<S>& in, const std::vector<S>& eff,
                     Matrix<S>& out) const {
    out.resize(in.rows(), s.out);
    switch (s.op) {
      case Op::linear: {
        Eigen::Map<const Matrix<S>> w(eff.data() + s.offset, s.out, s.in);
        out.noalias() = in * w.transpose();
        if (s.count > s.weight_count) {
          Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>> b(eff.data() + s.offset + s.weight_count, s.out);
          out.rowwise() += b;
        }
        break;
      }
      case Op::relu: out = in.cwiseMax(S(0)); break;
      case Op::host: {
        const int32_t dtype = pp::dtype_of<S>();
        const int64_t in_shape[2] = {in.rows(), s.in}, out_shape[2] = {out.rows(), s.out},
                      p_shape[1] = {s.count};
        pp_tensor tin{const_cast<S*>(in.data()), dtype, PP_DEVICE_CPU, 0, 2, in_shape, nullptr};
        pp_tensor tp{const_cast<S*>(eff.data() + s.offset), dtype, PP_DEVICE_CPU, 0, 1, p_shape, nullptr};
        pp_tensor tout{out.data(), dtype, PP_DEVICE_CPU, 0, 2, out_shape, nullptr};
        pp_error err{};
        if (s.view->host_forward(s.view->host_layer, &tin, &tp, &tout, &err) != PP_OK)
          throw std::runtime_error(std::string("layer '") + s.view->kind + "': " + err.message);
        break;
      }
    }
  }

  void forward_prefix() {
    acts_.resize(steps_.size() + 1);
    acts_[0] = x_;
    for (std::size_t l = 0; l < steps_.size(); ++l) forward_layer(steps_[l], acts_[l], eff_, acts_[l + 1]);
  }

  // Mean of the per-sample losses of `out` (rows are samples 0..B-1, repeated per candidate
  // when `first_candidate_row` is used), summed in double in sample order.
  double mean_loss(const Matrix<S>& out, int64_t first_row) const {
    const int64_t batch = x_.rows();
    double sum = 0.0;
    for (int64_t r = 0; r < batch; ++r) {
      const int64_t label = labels_.empty() ? 0 : labels_[static_cast<std::size_t>(r)];
      const double* target = targets_.empty() ? nullptr : targets_.data() + r * out.cols();
      sum += static_cast<double>(
          kernels::loss_row<S>(loss_, out.row(first_row + r).data(), out.cols(), label, target));
    }
    return sum / static_cast<double>(batch);
  }

  void evaluate_group(const pp_candidates& c, int64_t begin, int64_t end, Scratch& scratch,
                      double* losses) const {
    const int32_t d = c.d;
    const int64_t p = c.particle[begin];
    if (p < 0 || p >= c.n_particles) throw std::out_of_range("particle index out of range");
    const int64_t* coords = c.coords + p * d;
    std::size_t first = steps_.size(), last = 0;
    for (int32_t k = 0; k < d; ++k) {
      if (coords[k] < 0) continue;
      if (coords[k] >= n_params_) throw std::out_of_range("coordinate out of range");
      const std::size_t l = layer_of(coords[k]);
      first = std::min(first, l);
      last = std::max(last, l);
    }
    const int64_t batch = x_.rows();
    if (first == steps_.size()) {  // only padding moves: every candidate is the incumbent
      const double base_loss = mean_loss(acts_.back(), 0) + l2_ * base_sq_;
      std::fill(losses + begin, losses + end, base_loss);
      return;
    }
    const int64_t n = end - begin;
    const int64_t width = steps_[last].out;
    scratch.stack.resize(n * batch, width);
    scratch.hidden.resize(2);
    for (int64_t i = 0; i < n; ++i) {
      const double* delta = c.displacement + (begin + i) * d;
      for (int32_t k = 0; k < d; ++k)
        if (coords[k] >= 0)
          scratch.eff[static_cast<std::size_t>(coords[k])] =
              effective(coords[k], base_[static_cast<std::size_t>(coords[k])] + delta[k]);
      const Matrix<S>* h = &acts_[first];
      for (std::size_t l = first; l <= last; ++l) {
        Matrix<S>& out = scratch.hidden[(l - first) % 2];
        forward_layer(steps_[l], *h, scratch.eff, out);
        h = &out;
      }
      scratch.stack.middleRows(i * batch, batch) = *h;
      for (int32_t k = 0; k < d; ++k)
        if (coords[k] >= 0)
          scratch.eff[static_cast<std::size_t>(coords[k])] = eff_[static_cast<std::size_t>(coords[k])];
    }
    // Later layers share the incumbent's weights: one GEMM over the whole group.
    for (std::size_t l = last + 1; l < steps_.size(); ++l) {
      forward_layer(steps_[l], scratch.stack, eff_, scratch.next);
      scratch.stack.swap(scratch.next);
    }
    for (int64_t i = 0; i < n; ++i) {
      const double* delta = c.displacement + (begin + i) * d;
      double sq = base_sq_;
      for (int32_t k = 0; k < d; ++k) {
        if (coords[k] < 0) continue;
        const double b = base_[static_cast<std::size_t>(coords[k])];
        sq += (b + delta[k]) * (b + delta[k]) - b * b;
      }
      losses[begin + i] = mean_loss(scratch.stack, i * batch) + l2_ * sq;
    }
  }

  std::vector<LayerStep> steps_;
  std::vector<std::pair<int64_t, std::size_t>> owner_starts_;
  int64_t n_params_;
  kernels::LossKind loss_;
  double l2_;
  int threads_;
  Matrix<S> x_;
  std::vector<int64_t> labels_;
  std::vector<double> targets_;
  std::vector<double> base_;
  std::vector<S> eff_;
  double base_sq_ = 0.0;
  uint64_t generation_ = 0;
  std::vector<Matrix<S>> acts_;
  tbb::enumerable_thread_specific<Scratch> scratch_;
  std::string explain_;
};

}  // namespace

std::string dense_unsupported_reason(const pp_model_view& model, const pp_loss_view& loss,
                                     const pp_eval_options& options) {
  if (options.device != PP_DEVICE_CPU) return "it runs on the cpu only";
  if (options.dtype != PP_DTYPE_F32 && options.dtype != PP_DTYPE_F64)
    return std::string("it computes in float32 or float64, not ") + pp::dtype_name(options.dtype);
  if (kernels::loss_kind(loss.name) == kernels::LossKind::unknown)
    return std::string("unknown loss '") + (loss.name ? loss.name : "") + "'";
  for (int32_t i = 0; i < model.n_layers; ++i)
    if (model.layers[i].host_forward == nullptr && !is(model.layers[i].kind, "linear") &&
        !is(model.layers[i].kind, "relu"))
      return "layer " + std::to_string(i) + " has no host forward";
  return {};
}

std::unique_ptr<DenseEvaluator> make_dense_evaluator(const pp_model_view& model,
                                                     const pp_loss_view& loss,
                                                     const pp_eval_options& options) {
  if (const std::string why = dense_unsupported_reason(model, loss, options); !why.empty())
    throw std::invalid_argument(why);
  if (options.dtype == PP_DTYPE_F32) return std::make_unique<DenseEvaluatorImpl<float>>(model, loss, options);
  return std::make_unique<DenseEvaluatorImpl<double>>(model, loss, options);
}

}  // namespace polyprobe::cpu_tbb
