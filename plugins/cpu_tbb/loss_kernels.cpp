// Losses of many candidates from the incumbent's outputs plus a delta, vectorised over
// the samples of the batch (feature-major rows are contiguous per candidate), and of
// whole sample-major outputs. Sums are in double, in sample order.
#include "evaluator_impl.hpp"

#include <limits>

namespace polyprobe::cpu_tbb {

template <class S>
void EvaluatorImpl<S>::delta_losses(const Mat<S>& delta, int64_t n, double* mean_losses, Scratch& s) const {
  const int64_t batch = batch_, classes = plan_.out_features;
  const Mat<S>& z = acts_t_.back();  // [classes, batch]
  s.max_b.resize(batch);
  s.sum_b.resize(batch);
  s.tmp_b.resize(batch);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t col0 = i * batch;
    double sum = 0.0;
    if (loss_ == kernels::LossKind::cross_entropy) {
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
            total += ConstPacketMap<S>(probs_t_.data() + k * batch + b) * dl.exp();
            picked += ConstPacketMap<S>(one_hot_t_.data() + k * batch + b) * dl;
          }
          finite = (total <= std::numeric_limits<S>::max()).all();
          const Packet<S> loss = ConstPacketMap<S>(sample_loss_.data() + b) + total.log() - picked;
          partial += loss.template cast<double>();
        } else {
          for (int64_t r = b; r < batch; ++r) {
            S t = 0, y = 0;
            for (int64_t k = 0; k < classes; ++k) {
              const S dl = dl0[k * stride + r];
              t += probs_t_(k, r) * std::exp(dl);
              y += one_hot_t_(k, r) * dl;
            }
            finite = finite && t <= std::numeric_limits<S>::max();
            sum += static_cast<double>(sample_loss_(r) + std::log(t) - y);
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
        const int64_t y = labels_[static_cast<std::size_t>(b)];
        sum += static_cast<double>(s.tmp_b(b) - (z(y, b) + delta(y, col0 + b)));
      }
    } else {
      std::vector<S>& outputs = s.buffer_out;  // one sample's outputs
      outputs.resize(static_cast<std::size_t>(classes));
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t k = 0; k < classes; ++k) outputs[static_cast<std::size_t>(k)] = z(k, b) + delta(k, col0 + b);
        const int64_t label = labels_.empty() ? 0 : labels_[static_cast<std::size_t>(b)];
        const double* target = targets_.empty() ? nullptr : targets_.data() + b * classes;
        sum += static_cast<double>(kernels::loss_row<S>(loss_, outputs.data(), classes, label, target));
      }
    }
    mean_losses[i] = sum / static_cast<double>(batch);
  }
}

template <class S>
double EvaluatorImpl<S>::rows_loss(const Mat<S>& out, int64_t first_row) const {
  double sum = 0.0;
  for (int64_t r = 0; r < batch_; ++r) {
    const int64_t label = labels_.empty() ? 0 : labels_[static_cast<std::size_t>(r)];
    const double* target = targets_.empty() ? nullptr : targets_.data() + r * out.cols();
    sum += static_cast<double>(
        kernels::loss_row<S>(loss_, out.row(first_row + r).data(), out.cols(), label, target));
  }
  return sum / static_cast<double>(batch_);
}

#define POLYPROBE_INSTANTIATE(S)                                                                 \
  template void EvaluatorImpl<S>::delta_losses(const Mat<S>&, int64_t, double*, Scratch&) const; \
  template double EvaluatorImpl<S>::rows_loss(const Mat<S>&, int64_t) const;
POLYPROBE_INSTANTIATE(float)
POLYPROBE_INSTANTIATE(double)
#undef POLYPROBE_INSTANTIATE

}  // namespace polyprobe::cpu_tbb
