// The materialised paths, sample-major [rows, features]:
//   dense    - per candidate, the changed layers run with its effective weights (a
//              thread-local copy where only the particle's entries move and are put back),
//              then every later layer, whose weights the group shares, is one GEMM over the
//              stacked candidates of the group;
//   inplace  - the same on the one shared parameter copy, one candidate at a time, the
//              batch rows split over threads: no per-thread copies, bounded memory;
//   fallback - the whole forward of each materialised candidate through the host's own
//              layers, relying on no contract: always correct, slowest.
#include "materialised_paths.hpp"

#include <polyprobe/plugin/plugin.hpp>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <stdexcept>

namespace polyprobe::cpu_tbb {

template <class S>
void MaterialisedPaths<S>::set_candidate_params(const Candidates& c, int64_t cand, Scratch& s,
                                                S* eff) const {
  const int32_t d = c.d;
  const double* delta = c.displacement + cand * d;
  for (std::size_t t = 0; t < s.touched.size(); ++t) {
    double raw = ctx_.inc.base[static_cast<std::size_t>(s.touched[t])];
    for (int32_t k = 0; k < d; ++k)
      raw += s.coef[t * static_cast<std::size_t>(d) + static_cast<std::size_t>(k)] * delta[k];
    eff[s.touched[t]] = ctx_.effective(s.touched[t], raw);
  }
}

template <class S>
void MaterialisedPaths<S>::evaluate_dense(const Candidates& c, const Group& g, Scratch& s,
                                          double* losses) const {
  if (s.generation != ctx_.inc.generation) {
    s.eff = ctx_.inc.eff;
    s.generation = ctx_.inc.generation;
  }
  ctx_.collect_touched(c, g.particle, s);
  const auto first = static_cast<std::size_t>(ctx_.plan.layer_of(s.touched.front()));
  const auto last = static_cast<std::size_t>(ctx_.plan.layer_of(s.touched.back()));
  const int64_t n = g.end - g.begin, batch = ctx_.inc.batch;
  s.stack.resize(n * batch, ctx_.plan.layers[last].out);
  s.hidden.resize(2);
  for (int64_t i = 0; i < n; ++i) {
    set_candidate_params(c, g.begin + i, s, s.eff.data());
    const Mat<S>* h = &ctx_.inc.acts[first];
    for (std::size_t l = first; l <= last; ++l) {
      Mat<S>& out = s.hidden[(l - first) % 2];
      forward_layer(ctx_.plan.layers[l], *h, s.eff.data(), out);
      h = &out;
    }
    s.stack.middleRows(i * batch, batch) = *h;
    for (const int64_t t : s.touched)
      s.eff[static_cast<std::size_t>(t)] = ctx_.inc.eff[static_cast<std::size_t>(t)];
  }
  // Later layers share the incumbent's weights: one GEMM over the whole group.
  const Mat<S>& out = forward_suffix(ctx_.plan, last + 1, s.stack, ctx_.inc.eff.data(), s.suffix);
  for (int64_t i = 0; i < n; ++i)
    losses[g.begin + i] = ctx_.rows_loss(out, i * batch) + ctx_.l2_term(c, g, g.begin + i, s);
}

template <class S>
void MaterialisedPaths<S>::evaluate_inplace(const Candidates& c, const Group& g, Scratch& s,
                                            double* losses) {
  ctx_.collect_touched(c, g.particle, s);
  const auto first = static_cast<std::size_t>(ctx_.plan.layer_of(s.touched.front()));
  const int64_t batch = ctx_.inc.batch;
  // Samples are independent through affine and elementwise layers: split the rows.
  bool rows_independent = true;
  for (std::size_t l = first; l < ctx_.plan.layers.size(); ++l)
    rows_independent = rows_independent && ctx_.plan.layers[l].op != LayerOp::host;
  const int64_t block = rows_independent ? std::max<int64_t>(1, (batch + 7) / 8) : batch;
  const int64_t n_blocks = (batch + block - 1) / block;
  s.row_losses.resize(static_cast<std::size_t>(batch));
  for (int64_t cand = g.begin; cand < g.end; ++cand) {
    set_candidate_params(c, cand, s, ctx_.inc.eff.data());
    ctx_.arena->execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<int64_t>(0, n_blocks), [&](const tbb::blocked_range<int64_t>& r) {
            Mat<S> h, next;
            for (int64_t blk = r.begin(); blk != r.end(); ++blk) {
              const int64_t row0 = blk * block, rows = std::min(block, batch - row0);
              h = ctx_.inc.acts[first].middleRows(row0, rows);
              for (std::size_t l = first; l < ctx_.plan.layers.size(); ++l) {
                forward_layer(ctx_.plan.layers[l], h, ctx_.inc.eff.data(), next);
                h.swap(next);
              }
              for (int64_t b = 0; b < rows; ++b) {
                const int64_t label = ctx_.inc.labels.empty()
                                          ? 0
                                          : ctx_.inc.labels[static_cast<std::size_t>(row0 + b)];
                const double* target = ctx_.inc.targets.empty()
                                           ? nullptr
                                           : ctx_.inc.targets.data() + (row0 + b) * h.cols();
                s.row_losses[static_cast<std::size_t>(row0 + b)] = static_cast<double>(
                    kernels::loss_row<S>(ctx_.loss, h.row(b).data(), h.cols(), label, target));
              }
            }
          });
    });
    double sum = 0.0;
    for (int64_t b = 0; b < batch; ++b) sum += s.row_losses[static_cast<std::size_t>(b)];
    losses[cand] = sum / static_cast<double>(batch) + ctx_.l2_term(c, g, cand, s);
    for (const int64_t t : s.touched)
      ctx_.inc.eff[static_cast<std::size_t>(t)] =
          ctx_.effective(t, ctx_.inc.base[static_cast<std::size_t>(t)]);
  }
}

template <class S>
void MaterialisedPaths<S>::evaluate_fallback(const Candidates& c, const Group& g, Scratch& s,
                                             double* losses) const {
  if (s.raw_generation != ctx_.inc.generation) {
    s.raw_params.resize(ctx_.inc.base.size());
    for (std::size_t i = 0; i < ctx_.inc.base.size(); ++i)
      s.raw_params[i] = static_cast<S>(ctx_.inc.base[i]);
    s.raw_generation = ctx_.inc.generation;
  }
  ctx_.collect_touched(c, g.particle, s);
  const int32_t d = c.d;
  s.hidden.resize(2);
  for (int64_t cand = g.begin; cand < g.end; ++cand) {
    const double* delta = c.displacement + cand * d;
    for (std::size_t t = 0; t < s.touched.size(); ++t) {
      double raw = ctx_.inc.base[static_cast<std::size_t>(s.touched[t])];
      for (int32_t k = 0; k < d; ++k)
        raw += s.coef[t * static_cast<std::size_t>(d) + static_cast<std::size_t>(k)] * delta[k];
      s.raw_params[static_cast<std::size_t>(s.touched[t])] = static_cast<S>(raw);
    }
    const Mat<S>* h = &ctx_.inc.x;
    for (std::size_t l = 0; l < ctx_.plan.layers.size(); ++l) {
      Mat<S>& out = s.hidden[l % 2];
      forward_layer(ctx_.plan.layers[l], *h, s.raw_params.data(), out, true);
      h = &out;
    }
    losses[cand] = ctx_.rows_loss(*h, 0) + ctx_.l2_term(c, g, cand, s);
    for (const int64_t t : s.touched)
      s.raw_params[static_cast<std::size_t>(t)] =
          static_cast<S>(ctx_.inc.base[static_cast<std::size_t>(t)]);
  }
}

// S is a type here, which parentheses would break.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define POLYPROBE_INSTANTIATE(S)                                                                   \
  template void MaterialisedPaths<S>::set_candidate_params(const Candidates&, int64_t, Scratch&,   \
                                                           S*) const;                              \
  template void MaterialisedPaths<S>::evaluate_dense(const Candidates&, const Group&, Scratch&,    \
                                                     double*) const;                               \
  template void MaterialisedPaths<S>::evaluate_inplace(const Candidates&, const Group&, Scratch&,  \
                                                       double*);                                   \
  template void MaterialisedPaths<S>::evaluate_fallback(const Candidates&, const Group&, Scratch&, \
                                                        double*) const;
// NOLINTEND(bugprone-macro-parentheses)
POLYPROBE_INSTANTIATE(float)
POLYPROBE_INSTANTIATE(double)
#undef POLYPROBE_INSTANTIATE

}  // namespace polyprobe::cpu_tbb
