// The materialised paths, sample-major [rows, features]:
//   dense    - per candidate, the changed layers run with its effective weights (a
//              thread-local copy where only the particle's entries move and are put back),
//              then every later layer, whose weights the group shares, is one GEMM over the
//              stacked candidates of the group;
//   inplace  - the same on the one shared parameter copy, one candidate at a time, the
//              batch rows split over threads: no per-thread copies, bounded memory;
//   fallback - the whole forward of each materialised candidate through the host's own
//              layers, relying on no contract: always correct, slowest.
#include "evaluator_impl.hpp"

#include <polyprobe/plugin/plugin.hpp>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <stdexcept>

namespace polyprobe::cpu_tbb {

template <class S>
void EvaluatorImpl<S>::forward_layer(const LayerPlan& layer, const Mat<S>& in, const S* params,
                                     Mat<S>& out, bool host_only) const {
  out.resize(in.rows(), layer.out);
  if (!host_only && layer.op == LayerOp::affine) {
    const Eigen::Map<const Mat<S>> w(params + layer.offset, layer.out, layer.in);
    out.noalias() = in * w.transpose();
    if (layer.has_bias)
      out.rowwise() += Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>>(
          params + layer.offset + layer.weight_count, layer.out);
    return;
  }
  if (!host_only && layer.op == LayerOp::elementwise && layer.is_relu) {
    out = in.cwiseMax(S(0));
    return;
  }
  const int32_t dtype = pp::dtype_of<S>();
  const int64_t in_shape[2] = {in.rows(), layer.in}, out_shape[2] = {out.rows(), layer.out},
                p_shape[1] = {layer.count};
  pp_tensor tin{const_cast<S*>(in.data()), dtype, PP_DEVICE_CPU, 0, 2, in_shape, nullptr};
  pp_tensor tp{const_cast<S*>(params + layer.offset), dtype, PP_DEVICE_CPU, 0, 1, p_shape, nullptr};
  pp_tensor tout{out.data(), dtype, PP_DEVICE_CPU, 0, 2, out_shape, nullptr};
  pp_error err{};
  if (layer.view->host_forward(layer.view->host_layer, &tin, &tp, &tout, &err) != PP_OK)
    throw std::runtime_error(std::string("layer '") + layer.view->kind + "': " + err.message);
}

template <class S>
void EvaluatorImpl<S>::set_candidate_params(const Candidates& c, int64_t cand, Scratch& s,
                                            S* eff) const {
  const int32_t d = c.d;
  const double* delta = c.displacement + cand * d;
  for (std::size_t t = 0; t < s.touched.size(); ++t) {
    double raw = base_[static_cast<std::size_t>(s.touched[t])];
    for (int32_t k = 0; k < d; ++k)
      raw += s.coef[t * static_cast<std::size_t>(d) + static_cast<std::size_t>(k)] * delta[k];
    eff[s.touched[t]] = effective(s.touched[t], raw);
  }
}

template <class S>
void EvaluatorImpl<S>::evaluate_dense(const Candidates& c, const Group& g, Scratch& s,
                                      double* losses) const {
  if (s.generation != generation_) {
    s.eff = eff_;
    s.generation = generation_;
  }
  collect_touched(c, g.particle, s);
  const auto first = static_cast<std::size_t>(plan_.layer_of(s.touched.front()));
  const auto last = static_cast<std::size_t>(plan_.layer_of(s.touched.back()));
  const int64_t n = g.end - g.begin, batch = batch_;
  s.stack.resize(n * batch, plan_.layers[last].out);
  s.hidden.resize(2);
  for (int64_t i = 0; i < n; ++i) {
    set_candidate_params(c, g.begin + i, s, s.eff.data());
    const Mat<S>* h = &acts_[first];
    for (std::size_t l = first; l <= last; ++l) {
      Mat<S>& out = s.hidden[(l - first) % 2];
      forward_layer(plan_.layers[l], *h, s.eff.data(), out);
      h = &out;
    }
    s.stack.middleRows(i * batch, batch) = *h;
    for (const int64_t t : s.touched)
      s.eff[static_cast<std::size_t>(t)] = eff_[static_cast<std::size_t>(t)];
  }
  // Later layers share the incumbent's weights: one GEMM over the whole group.
  for (std::size_t l = last + 1; l < plan_.layers.size(); ++l) {
    forward_layer(plan_.layers[l], s.stack, eff_.data(), s.stack_next);
    s.stack.swap(s.stack_next);
  }
  for (int64_t i = 0; i < n; ++i)
    losses[g.begin + i] = rows_loss(s.stack, i * batch) + l2_term(c, g, g.begin + i, s);
}

template <class S>
void EvaluatorImpl<S>::evaluate_inplace(const Candidates& c, const Group& g, Scratch& s,
                                        double* losses) {
  collect_touched(c, g.particle, s);
  const auto first = static_cast<std::size_t>(plan_.layer_of(s.touched.front()));
  const int64_t batch = batch_;
  // Samples are independent through affine and elementwise layers: split the rows.
  bool rows_independent = true;
  for (std::size_t l = first; l < plan_.layers.size(); ++l)
    rows_independent = rows_independent && plan_.layers[l].op != LayerOp::host;
  const int64_t block = rows_independent ? std::max<int64_t>(1, (batch + 7) / 8) : batch;
  const int64_t n_blocks = (batch + block - 1) / block;
  s.row_losses.resize(static_cast<std::size_t>(batch));
  for (int64_t cand = g.begin; cand < g.end; ++cand) {
    set_candidate_params(c, cand, s, eff_.data());
    arena_->execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<int64_t>(0, n_blocks), [&](const tbb::blocked_range<int64_t>& r) {
            Mat<S> h, next;
            for (int64_t blk = r.begin(); blk != r.end(); ++blk) {
              const int64_t row0 = blk * block, rows = std::min(block, batch - row0);
              h = acts_[first].middleRows(row0, rows);
              for (std::size_t l = first; l < plan_.layers.size(); ++l) {
                forward_layer(plan_.layers[l], h, eff_.data(), next);
                h.swap(next);
              }
              for (int64_t b = 0; b < rows; ++b) {
                const int64_t label =
                    labels_.empty() ? 0 : labels_[static_cast<std::size_t>(row0 + b)];
                const double* target =
                    targets_.empty() ? nullptr : targets_.data() + (row0 + b) * h.cols();
                s.row_losses[static_cast<std::size_t>(row0 + b)] = static_cast<double>(
                    kernels::loss_row<S>(loss_, h.row(b).data(), h.cols(), label, target));
              }
            }
          });
    });
    double sum = 0.0;
    for (int64_t b = 0; b < batch; ++b) sum += s.row_losses[static_cast<std::size_t>(b)];
    losses[cand] = sum / static_cast<double>(batch) + l2_term(c, g, cand, s);
    for (const int64_t t : s.touched)
      eff_[static_cast<std::size_t>(t)] = effective(t, base_[static_cast<std::size_t>(t)]);
  }
}

template <class S>
void EvaluatorImpl<S>::evaluate_fallback(const Candidates& c, const Group& g, Scratch& s,
                                         double* losses) const {
  if (s.raw_generation != generation_) {
    s.raw_params.resize(base_.size());
    for (std::size_t i = 0; i < base_.size(); ++i) s.raw_params[i] = static_cast<S>(base_[i]);
    s.raw_generation = generation_;
  }
  collect_touched(c, g.particle, s);
  const int32_t d = c.d;
  s.hidden.resize(2);
  for (int64_t cand = g.begin; cand < g.end; ++cand) {
    const double* delta = c.displacement + cand * d;
    for (std::size_t t = 0; t < s.touched.size(); ++t) {
      double raw = base_[static_cast<std::size_t>(s.touched[t])];
      for (int32_t k = 0; k < d; ++k)
        raw += s.coef[t * static_cast<std::size_t>(d) + static_cast<std::size_t>(k)] * delta[k];
      s.raw_params[static_cast<std::size_t>(s.touched[t])] = static_cast<S>(raw);
    }
    const Mat<S>* h = &x_;
    for (std::size_t l = 0; l < plan_.layers.size(); ++l) {
      Mat<S>& out = s.hidden[l % 2];
      forward_layer(plan_.layers[l], *h, s.raw_params.data(), out, true);
      h = &out;
    }
    losses[cand] = rows_loss(*h, 0) + l2_term(c, g, cand, s);
    for (const int64_t t : s.touched)
      s.raw_params[static_cast<std::size_t>(t)] =
          static_cast<S>(base_[static_cast<std::size_t>(t)]);
  }
}

// S is a type here, which parentheses would break.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define POLYPROBE_INSTANTIATE(S)                                                                 \
  template void EvaluatorImpl<S>::forward_layer(const LayerPlan&, const Mat<S>&, const S*,       \
                                                Mat<S>&, bool) const;                            \
  template void EvaluatorImpl<S>::set_candidate_params(const Candidates&, int64_t, Scratch&, S*) \
      const;                                                                                     \
  template void EvaluatorImpl<S>::evaluate_dense(const Candidates&, const Group&, Scratch&,      \
                                                 double*) const;                                 \
  template void EvaluatorImpl<S>::evaluate_inplace(const Candidates&, const Group&, Scratch&,    \
                                                   double*);                                     \
  template void EvaluatorImpl<S>::evaluate_fallback(const Candidates&, const Group&, Scratch&,   \
                                                    double*) const;
// NOLINTEND(bugprone-macro-parentheses)
POLYPROBE_INSTANTIATE(float)
POLYPROBE_INSTANTIATE(double)
#undef POLYPROBE_INSTANTIATE

}  // namespace polyprobe::cpu_tbb
