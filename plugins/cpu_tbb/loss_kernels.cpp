// Losses of many candidates from the incumbent's outputs plus a delta, vectorised over
// the samples of the batch (feature-major rows are contiguous per candidate), and of
// whole sample-major outputs. Sums are in double, in sample order.
#include "delta_path.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace polyprobe::cpu_tbb {

template <class S>
void DeltaPath<S>::delta_losses(const Mat<S>& delta, int64_t n, double* mean_losses,
                                Scratch& s) const {
  const int64_t batch = ctx_.inc.batch, classes = ctx_.plan.out_features;
  const Mat<S>& z = ctx_.inc.acts_t.back();  // [classes, batch]
  s.max_b.resize(batch);
  s.sum_b.resize(batch);
  s.tmp_b.resize(batch);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t col0 = i * batch;
    double sum = 0.0;
    if (ctx_.loss == kernels::LossKind::cross_entropy) {
      // From the incumbent's softmax p and loss L0, one lane per sample:
      // L = L0 + log(sum_k p_k exp(dl_k)) - dl_y. One exp per logit, no max pass.
      constexpr int lanes = kLanes<S>;
      const int64_t stride = delta.cols();
      const S* dl0 = delta.data() + col0;
      bool finite = true;
      // Per-lane float64 partial sums, added in a fixed order at the end: no serial chain.
      Eigen::Array<double, lanes, 1> partial = Eigen::Array<double, lanes, 1>::Zero();
      for (int64_t b = 0; b < batch && finite; b += lanes) {
        Packet<S> total = Packet<S>::Zero(), picked = Packet<S>::Zero();
        if (b + lanes <= batch) {
          for (int64_t k = 0; k < classes; ++k) {
            const Packet<S> dl = ConstPacketMap<S>(dl0 + k * stride + b);
            total += ConstPacketMap<S>(ctx_.inc.probs_t.data() + k * batch + b) * dl.exp();
            picked += ConstPacketMap<S>(ctx_.inc.one_hot_t.data() + k * batch + b) * dl;
          }
          constexpr uint32_t all_lanes = (uint32_t{1} << lanes) - 1;
          finite =
              lanes_where<LaneTest::at_most>(total, std::numeric_limits<S>::max()) == all_lanes;
          const Packet<S> loss =
              ConstPacketMap<S>(ctx_.inc.sample_loss.data() + b) + total.log() - picked;
          partial += loss.template cast<double>();
        } else {
          for (int64_t r = b; r < batch; ++r) {
            S t = 0, y = 0;
            for (int64_t k = 0; k < classes; ++k) {
              const S dl = dl0[k * stride + r];
              t += ctx_.inc.probs_t(k, r) * std::exp(dl);
              y += ctx_.inc.one_hot_t(k, r) * dl;
            }
            finite = finite && t <= std::numeric_limits<S>::max();
            sum += static_cast<double>(ctx_.inc.sample_loss(r) + std::log(t) - y);
          }
        }
      }
      if (finite) {
        mean_losses[i] = (sum + partial.sum()) / static_cast<double>(batch);
        continue;
      }
      sum = 0.0;
      // A logit grew past exp's range: the stabilised formula of kernels::cross_entropy_row.
      s.max_b = z.row(0).array() + delta.row(0).segment(col0, batch).array();
      for (int64_t k = 1; k < classes; ++k)
        s.max_b = s.max_b.max(z.row(k).array() + delta.row(k).segment(col0, batch).array());
      s.sum_b.setZero();
      for (int64_t k = 0; k < classes; ++k)
        s.sum_b += (z.row(k).array() + delta.row(k).segment(col0, batch).array() - s.max_b).exp();
      s.tmp_b = s.max_b + s.sum_b.log();
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t y = ctx_.inc.labels[static_cast<std::size_t>(b)];
        sum += static_cast<double>(s.tmp_b(b) - (z(y, b) + delta(y, col0 + b)));
      }
    } else {
      std::vector<S>& outputs = s.buffer_out;  // one sample's outputs
      outputs.resize(static_cast<std::size_t>(classes));
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t k = 0; k < classes; ++k)
          outputs[static_cast<std::size_t>(k)] = z(k, b) + delta(k, col0 + b);
        const int64_t label =
            ctx_.inc.labels.empty() ? 0 : ctx_.inc.labels[static_cast<std::size_t>(b)];
        const double* target =
            ctx_.inc.targets.empty() ? nullptr : ctx_.inc.targets.data() + b * classes;
        sum += static_cast<double>(
            kernels::loss_row<S>(ctx_.loss, outputs.data(), classes, label, target));
      }
    }
    mean_losses[i] = sum / static_cast<double>(batch);
  }
}

template <class S>
bool DeltaPath<S>::one_logit_losses(int64_t u, const Mat<S>& sparse, int64_t n,
                                    double* mean_losses) const {
  constexpr int lanes = kLanes<S>;
  const int64_t batch = ctx_.inc.batch;
  const S* others = ctx_.inc.others_t.data() + u * batch;
  const S* p = ctx_.inc.probs_t.data() + u * batch;
  const S* label = ctx_.inc.one_hot_t.data() + u * batch;
  constexpr uint32_t all_lanes = (uint32_t{1} << lanes) - 1;
  for (int64_t i = 0; i < n; ++i) {
    Eigen::Array<double, lanes, 1> partial = Eigen::Array<double, lanes, 1>::Zero();
    for (int64_t b = 0; b < batch; b += lanes) {
      const Packet<S> dl = ConstPacketMap<S>(sparse.data() + i * batch + b);
      const Packet<S> total = ConstPacketMap<S>(others + b) + ConstPacketMap<S>(p + b) * dl.exp();
      if (lanes_where<LaneTest::at_most>(total, std::numeric_limits<S>::max()) != all_lanes)
        return false;
      // Assigned before the cast (see sparse_delta_losses).
      const Packet<S> loss = ConstPacketMap<S>(ctx_.inc.sample_loss.data() + b) + total.log() -
                             ConstPacketMap<S>(label + b) * dl;
      partial += loss.template cast<double>();
    }
    mean_losses[i] = partial.sum() / static_cast<double>(batch);
  }
  return true;
}

template <class S>
bool DeltaPath<S>::sparse_delta_losses(const std::vector<int64_t>& units, const Mat<S>& sparse,
                                       int64_t n, double* mean_losses) const {
  const int64_t batch = ctx_.inc.batch, classes = ctx_.plan.out_features;
  constexpr int64_t kMaxClasses = 64;
  if (ctx_.loss != kernels::LossKind::cross_entropy || classes > kMaxClasses) return false;
  int32_t row_of[kMaxClasses];  // the row of sparse that changes class k, or -1
  std::fill(row_of, row_of + classes, -1);
  for (std::size_t r = 0; r < units.size(); ++r) row_of[units[r]] = static_cast<int32_t>(r);
  constexpr int lanes = kLanes<S>;
  const int64_t stride = sparse.cols();
  if (units.size() == 1 && batch % lanes == 0 && ctx_.inc.others_t.rows() == classes)
    return one_logit_losses(units[0], sparse, n, mean_losses);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t col0 = i * batch;
    // delta_losses' sums, class by class in the same order.
    Eigen::Array<double, lanes, 1> partial = Eigen::Array<double, lanes, 1>::Zero();
    for (int64_t b = 0; b < batch; b += lanes) {
      if (b + lanes <= batch) {
        Packet<S> total = Packet<S>::Zero(), picked = Packet<S>::Zero();
        for (int64_t k = 0; k < classes; ++k) {
          const Packet<S> p = ConstPacketMap<S>(ctx_.inc.probs_t.data() + k * batch + b);
          if (row_of[k] < 0) {
            total += p;
            continue;
          }
          const Packet<S> dl = ConstPacketMap<S>(sparse.data() + row_of[k] * stride + col0 + b);
          total += p * dl.exp();
          picked += ConstPacketMap<S>(ctx_.inc.one_hot_t.data() + k * batch + b) * dl;
        }
        constexpr uint32_t all_lanes = (uint32_t{1} << lanes) - 1;
        if (lanes_where<LaneTest::at_most>(total, std::numeric_limits<S>::max()) != all_lanes)
          return false;
        // Assigned before the cast: a cast in the same expression evaluates it coefficient by
        // coefficient, the log through the scalar logf.
        const Packet<S> loss =
            ConstPacketMap<S>(ctx_.inc.sample_loss.data() + b) + total.log() - picked;
        partial += loss.template cast<double>();
      } else {
        return false;
      }
    }
    mean_losses[i] = partial.sum() / static_cast<double>(batch);
  }
  return true;
}

// Rank-one logit changes: the loss change is a power series in s (kernels/cgf_series.hpp),
// certified exact at float32 precision for |s| M <= kCgfLimit; samples beyond it take the
// exact route.
template <class S>
void DeltaPath<S>::build_cumulants(Cumulants& table, int64_t directions, const S* g, int64_t su,
                                   int64_t sk, int64_t sb, const std::vector<char>& used) const {
  constexpr int terms = kernels::kCgfTerms;
  constexpr int64_t width = 8;  // samples per packet of the build (float64 lanes)
  using Lanes = Eigen::Array<double, width, 1>;
  const int64_t classes = ctx_.plan.out_features, batch = ctx_.inc.batch;
  const int64_t padded = (batch + width - 1) / width * width;
  table.coef.resize(directions * terms, batch);
  table.spread.resize(directions, batch);
  // Class-major rows over the batch (padded by repeating the last sample), so the series
  // runs over a packet of samples at once.
  using Rows = Eigen::Array<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Rows p(classes, padded);
  for (int64_t k = 0; k < classes; ++k)
    for (int64_t b = 0; b < padded; ++b)
      p(k, b) = static_cast<double>(ctx_.inc.probs_t(k, std::min(b, batch - 1)));
  // Directions are independent: split over threads (each row is written by one thread, so
  // the table is the same for any thread count).
  ctx_.arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, directions, 16),
        [&](const tbb::blocked_range<int64_t>& range) {
          Rows values(classes, padded);
          Eigen::Array<double, 1, Eigen::Dynamic> label_value(padded);
          Lanes coef[terms];
          for (int64_t u = range.begin(); u != range.end(); ++u) {
            if (used[static_cast<std::size_t>(u)] == 0) continue;  // no candidate reads it
            for (int64_t k = 0; k < classes; ++k)
              for (int64_t b = 0; b < padded; ++b)
                values(k, b) =
                    static_cast<double>(g[u * su + k * sk + std::min(b, batch - 1) * sb]);
            for (int64_t b = 0; b < padded; ++b)
              label_value(b) =
                  values(ctx_.inc.labels[static_cast<std::size_t>(std::min(b, batch - 1))], b);
            for (int64_t b0 = 0; b0 < padded; b0 += width) {
              const Lanes spread = kernels::cgf_series<Lanes>(
                  classes, [&](int64_t k) { return Lanes::Map(p.row(k).data() + b0); },
                  [&](int64_t k) { return Lanes::Map(values.row(k).data() + b0); },
                  Lanes::Map(label_value.data() + b0), coef);
              const int64_t n = std::min(width, batch - b0);
              for (int t = 0; t < terms; ++t)
                table.coef.row(u * terms + t).segment(b0, n) =
                    coef[t].head(n).template cast<S>().transpose().matrix();
              table.spread.row(u).segment(b0, n) =
                  spread.head(n).template cast<S>().transpose().matrix();
            }
          }
        });
  });
  table.built = true;
}

template <class S>
S DeltaPath<S>::rank_one_exact(int64_t u, S s, int64_t b, int64_t kink_layer) const {
  const int64_t classes = ctx_.plan.out_features;
  S logits[64];
  S* x = classes <= 64 ? logits : nullptr;
  std::vector<S> heap;
  if (x == nullptr) {
    heap.resize(static_cast<std::size_t>(classes));
    x = heap.data();
  }
  const Mat<S>& z = ctx_.inc.acts_t.back();
  if (kink_layer < 0) {
    const LayerPlan& last = ctx_.plan.layers.back();
    for (int64_t k = 0; k < classes; ++k)
      x[k] = z(k, b) + s * ctx_.inc.eff[static_cast<std::size_t>(last.offset + k * last.in + u)];
  } else {
    const auto l = static_cast<std::size_t>(kink_layer);
    const KinkTable& table = kink_[l];
    for (int64_t k = 0; k < classes; ++k) x[k] = z(k, b) + s * table.response(u * classes + k, b);
    // ReLU units that cross their kink: exact minus linear response (as in apply_kink).
    // Sample-major rows: contiguous over the hidden units.
    const S* pre = ctx_.inc.acts[l + 1].row(b).data();
    const S* post = ctx_.inc.acts[l + 2].row(b).data();
    const S* w_col = ctx_.inc.weights_t[l].row(u).data();
    const int64_t mid = ctx_.inc.acts[l + 1].cols();
    for (int64_t j = 0; j < mid; ++j) {
      const S dz = w_col[j] * s, v = pre[j] + dz;
      if ((v > S(0)) == (pre[j] > S(0))) continue;
      const S correction = (v > S(0) ? v : S(0)) - post[j] - (pre[j] > S(0) ? dz : S(0));
      for (int64_t k = 0; k < classes; ++k) x[k] += ctx_.inc.weights_t[l + 2](j, k) * correction;
    }
  }
  return kernels::cross_entropy_row<S>(x, classes, ctx_.inc.labels[static_cast<std::size_t>(b)]);
}

template <class S>
void DeltaPath<S>::rank_one_logits(int64_t u, const Packet<S>& s, int64_t b, int64_t kink_layer,
                                   uint32_t crossing, Packet<S>* x) const {
  constexpr int lanes = kLanes<S>;
  const int64_t classes = ctx_.plan.out_features, batch = ctx_.inc.batch;
  const Mat<S>& z = ctx_.inc.acts_t.back();
  if (kink_layer < 0) {
    const LayerPlan& last = ctx_.plan.layers.back();
    for (int64_t k = 0; k < classes; ++k)
      x[k] = ConstPacketMap<S>(z.data() + k * batch + b) +
             s * ctx_.inc.eff[static_cast<std::size_t>(last.offset + k * last.in + u)];
    return;
  }
  const auto l = static_cast<std::size_t>(kink_layer);
  const KinkTable& table = kink_[l];
  for (int64_t k = 0; k < classes; ++k)
    x[k] = ConstPacketMap<S>(z.data() + k * batch + b) +
           s * ConstPacketMap<S>(table.response.data() + (u * classes + k) * batch + b);
  if (crossing == 0) return;
  // ReLU units that cross their kink: exact minus linear response, as rank_one_exact adds
  // them (in unit order), found by a vector scan (collect_crossing).
  const S* w_col = ctx_.inc.weights_t[l].row(u).data();
  const int64_t mid = ctx_.inc.acts[l + 1].cols();
  const Mat<S>& w_next = ctx_.inc.weights_t[l + 2];  // [mid, classes]
  // The lane's corrections add up over its classes, in a register when they fit one packet
  // (a row in memory otherwise), then join its logits.
  const bool narrow = classes <= lanes;
  alignas(64) int32_t found[kCrossingChunk];
  for (int lane = 0; lane < lanes; ++lane) {
    if ((crossing >> lane & 1U) == 0) continue;
    const S sv = s(lane);
    const int64_t sample = b + lane;
    const S* pre = ctx_.inc.acts[l + 1].row(sample).data();
    const S* post = ctx_.inc.acts[l + 2].row(sample).data();
    Packet<S> acc_packet = Packet<S>::Zero();
    S acc[ExactLanes<S>::kMaxClasses];
    bool any = false;
    for (int64_t j0 = 0; j0 < mid; j0 += kCrossingChunk) {
      const int count =
          collect_crossing(pre, w_col, sv, j0, std::min(mid, j0 + kCrossingChunk), found);
      for (int f = 0; f < count; ++f) {
        const int64_t j = found[f];
        const S dz = w_col[j] * sv, v = pre[j] + dz;
        if ((v > S(0)) == (pre[j] > S(0))) continue;
        const S correction = (v > S(0) ? v : S(0)) - post[j] - (pre[j] > S(0) ? dz : S(0));
        const S* w = w_next.row(j).data();
        if (narrow) {
          acc_packet = load_first(w, classes) * correction + acc_packet;
        } else {
          if (!any) std::fill(acc, acc + classes, S(0));
          for (int64_t k = 0; k < classes; ++k) acc[k] += w[k] * correction;
        }
        any = true;
      }
    }
    if (any && narrow)
      for (int64_t k = 0; k < classes; ++k) x[k](lane) += acc_packet(k);
    else if (any)
      for (int64_t k = 0; k < classes; ++k) x[k](lane) += acc[k];
  }
}

template <class S>
void DeltaPath<S>::flush_exact(ExactLanes<S>& q) const {
  if (q.count == 0) return;
  const int64_t classes = ctx_.plan.out_features;
  // Lanes nobody waits in hold zeros: a finite loss nobody reads.
  for (int lane = q.count; lane < kLanes<S>; ++lane) {
    for (int64_t k = 0; k < classes; ++k) q.logits[k](lane) = S(0);
    q.picked(lane) = S(0);
  }
  // The cross-entropy lane by lane in vector code, so a lane's loss does not depend on which
  // lane, or which packet, it was computed in.
  const Packet<S>* x = q.logits;
  Packet<S> m = x[0];
  for (int64_t k = 1; k < classes; ++k) m = m.max(x[k]);
  Packet<S> sum = Packet<S>::Zero();
  for (int64_t k = 0; k < classes; ++k) sum += (x[k] - m).exp();
  const Packet<S> loss = m + sum.log() - q.picked;
  for (int lane = 0; lane < q.count; ++lane)
    q.lane_losses[static_cast<std::size_t>(q.target[lane])] = loss(lane);
  q.count = 0;
}

template <class S>
void DeltaPath<S>::rank_one_losses(const Cumulants& table, int64_t u, const Mat<S>& s_values,
                                   int64_t n, int64_t kink_layer, ExactLanes<S>& q) const {
  constexpr int lanes = kLanes<S>;
  const int64_t batch = ctx_.inc.batch, classes = ctx_.plan.out_features;
  const int64_t whole = batch / lanes * lanes;  // samples in whole packets
  constexpr int terms = kernels::kCgfTerms;
  const S limit = static_cast<S>(kernels::kCgfLimit);
  const S above = std::nextafter(limit, std::numeric_limits<S>::infinity());  // q > limit
  const S* coef = table.coef.data() + u * terms * batch;  // row t: the coefficient of s^(t+1)
  const S* spread = table.spread.data() + u * batch;
  const KinkTable* kink = kink_layer >= 0 ? &kink_[static_cast<std::size_t>(kink_layer)] : nullptr;
  const S* room_up = kink != nullptr ? kink->room_up.data() + u * batch : nullptr;
  const S* room_down = kink != nullptr ? kink->room_down.data() + u * batch : nullptr;
  // The lanes of packet [b, b + kLanes) whose move s may make a ReLU unit cross its kink
  // (closer than 0.999 of the room counts, against rounding): the exact route.
  const auto may_cross = [&](const Packet<S>& s, int64_t b) -> uint32_t {
    if (kink == nullptr) return 0;
    return lanes_at_least<S>(select_positive<S>(s, s * ConstPacketMap<S>(room_up + b),
                                                -s * ConstPacketMap<S>(room_down + b)),
                             S(0.999));
  };
  const bool stage = classes <= ExactLanes<S>::kMaxClasses;
  const auto first = static_cast<int64_t>(q.lane_losses.size());
  const int64_t packets = whole / lanes;
  q.lane_losses.resize(static_cast<std::size_t>(first + n * whole));
  q.exact_lanes.resize(static_cast<std::size_t>(n * packets));
  for (int64_t i = 0; i < n; ++i) {
    double tail = 0.0;
    // The samples past the last whole packet, one by one, exactly.
    for (int64_t r = whole; r < batch; ++r)
      tail += static_cast<double>(rank_one_exact(u, s_values.data()[i * batch + r], r, kink_layer));
    q.pending.push_back({0, first + i * whole, tail, 0.0});
  }
  // Every candidate's series losses, a packet of samples at a time, the packet's
  // coefficients read once for all candidates; the lanes to compute exactly are marked.
  for (int64_t p = 0; p < packets; ++p) {
    const int64_t b = p * lanes;
    Packet<S> c[terms];
    for (int t = 0; t < terms; ++t) c[t] = ConstPacketMap<S>(coef + t * batch + b);
    const Packet<S> spread_b = ConstPacketMap<S>(spread + b);
    const Packet<S> loss0 = ConstPacketMap<S>(ctx_.inc.sample_loss.data() + b);
    for (int64_t i = 0; i < n; ++i) {
      const Packet<S> s = ConstPacketMap<S>(s_values.data() + i * batch + b);
      // K(s) - s g_y = s (kappa_1 - g_y) + sum_n kappa_n s^n / n!, by Estrin's scheme: pairs
      // of terms, then pairs of pairs with s^2, s^4, ...: a chain of log2(N) steps where
      // Horner's was N multiplies and adds long (the loop was latency-bound).
      Packet<S> level[terms];
      for (int t = 0; t < terms; ++t) level[t] = c[t];
      Packet<S> power = s;
      for (int width = terms; width > 1; width = (width + 1) / 2) {
        for (int j = 0; j < width / 2; ++j) level[j] = level[2 * j] + level[2 * j + 1] * power;
        if (width % 2 == 1) level[width / 2] = level[width - 1];
        power = power * power;
      }
      S* out = q.lane_losses.data() + first + i * whole + b;
      PacketMap<S>{out} = loss0 + s * level[0];
      // Lanes outside the certified range, and lanes where a ReLU unit may cross its kink.
      q.exact_lanes[static_cast<std::size_t>(i * packets + p)] =
          lanes_at_least<S>(s.abs() * spread_b, above) | may_cross(s, b);
    }
  }
  // The marked lanes: their logits join the waiting packet, their losses come with it.
  Packet<S> x[ExactLanes<S>::kMaxClasses];
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < packets; ++p) {
      const uint32_t exact = q.exact_lanes[static_cast<std::size_t>(i * packets + p)];
      if (exact == 0) continue;
      const int64_t b = p * lanes, at = first + i * whole + b;
      const Packet<S> s = ConstPacketMap<S>(s_values.data() + i * batch + b);
      if (!stage) {
        for (uint32_t m = exact; m != 0; m &= m - 1) {
          const int lane = std::countr_zero(m);
          q.lane_losses[static_cast<std::size_t>(at + lane)] =
              rank_one_exact(u, s(lane), b + lane, kink_layer);
        }
        continue;
      }
      // Only the lanes that may cross need the scan for crossing units.
      rank_one_logits(u, s, b, kink_layer, may_cross(s, b), x);
      for (uint32_t m = exact; m != 0; m &= m - 1) {
        const int lane = std::countr_zero(m);
        for (int64_t k = 0; k < classes; ++k) q.logits[k](q.count) = x[k](lane);
        q.picked(q.count) = x[ctx_.inc.labels[static_cast<std::size_t>(b + lane)]](lane);
        q.target[q.count] = at + lane;
        if (++q.count == lanes) flush_exact(q);
      }
    }
}

template <class S>
void DeltaPath<S>::finish_task(Scratch& s, double* losses) const {
  ExactLanes<S>& q = s.exact;
  flush_exact(q);
  constexpr int lanes = kLanes<S>;
  const int64_t batch = ctx_.inc.batch, whole = batch / lanes * lanes;
  for (const typename ExactLanes<S>::Pending& p : q.pending) {
    // Per-lane float64 partial sums, added in a fixed order at the end: no serial chain.
    Eigen::Array<double, lanes, 1> partial = Eigen::Array<double, lanes, 1>::Zero();
    for (int64_t b = 0; b < whole; b += lanes)
      partial += ConstPacketMap<S>(q.lane_losses.data() + p.offset + b).template cast<double>();
    losses[p.loss_index] = (partial.sum() + p.tail) / static_cast<double>(batch) + p.l2;
  }
  q.pending.clear();
  q.lane_losses.clear();
}

#define POLYPROBE_INSTANTIATE(S)                                                                 \
  template void DeltaPath<S>::delta_losses(const Mat<S>&, int64_t, double*, Scratch&) const;     \
  template bool DeltaPath<S>::sparse_delta_losses(const std::vector<int64_t>&, const Mat<S>&,    \
                                                  int64_t, double*) const;                       \
  template bool DeltaPath<S>::one_logit_losses(int64_t, const Mat<S>&, int64_t, double*) const;  \
  template void DeltaPath<S>::build_cumulants(Cumulants&, int64_t, const S*, int64_t, int64_t,   \
                                              int64_t, const std::vector<char>&) const;          \
  template void DeltaPath<S>::rank_one_losses(const Cumulants&, int64_t, const Mat<S>&, int64_t, \
                                              int64_t, ExactLanes<S>&) const;                    \
  template S DeltaPath<S>::rank_one_exact(int64_t, S, int64_t, int64_t) const;                   \
  template void DeltaPath<S>::rank_one_logits(int64_t, const Packet<S>&, int64_t, int64_t,       \
                                              uint32_t, Packet<S>*) const;                       \
  template void DeltaPath<S>::flush_exact(ExactLanes<S>&) const;                                 \
  template void DeltaPath<S>::finish_task(Scratch&, double*) const;
POLYPROBE_INSTANTIATE(float)
POLYPROBE_INSTANTIATE(double)
#undef POLYPROBE_INSTANTIATE

}  // namespace polyprobe::cpu_tbb
