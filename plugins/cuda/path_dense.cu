// The dense and materialised paths of a CUDA session: the changed ops' weights materialised
// per candidate and run as batched GEMMs, from the reused prefix or from the inputs
// (session_impl.cuh).
#include "session_impl.cuh"

namespace polyprobe::cuda {

// The dense and materialised paths: every op from `start` on runs for each candidate with
// cuBLAS; the ops the candidates change (first..last) with their own materialised weights
// (a strided batched GEMM), the others with the incumbent's (one GEMM over the chunk). The
// dense path starts at the first changed op from the incumbent's input there (prefix
// reuse); the materialised path starts at the inputs and reuses nothing, so it checks the
// others.
// With `site`, every particle of the chunk has a site plan in op `first` (== last), which
// the site-local kernels run instead of the op's dense form.
template <class T>
void DeviceSession<T>::run_dense_chunk(const CandidateSource& src, int64_t count, int32_t start,
                                       int32_t first, int32_t last, bool site) {
  cudaStream_t s = stream_.get();
  const int64_t rows = count * batch_;
  buf_a_.reserve(sz(rows * plan_.max_width));
  buf_b_.reserve(sz(rows * plan_.max_width));
  per_.reserve(sz(rows));
  dq_.reserve(sz(count * elem_max_));
  q_new_.reserve(sz(count * elem_max_));
  w_cand_.reserve(sz(count * largest_block()));
  scratch_.reserve(sz(rows * largest_scratch()));
  l2_terms_.reserve(sz(count * elem_max_));
  l2c_.reserve(sz(count));
  const ParticleTable t = table();
  launch_deltas<T>(src, t, count, theta_d_.data(), ops_d_.data(), eff_d_.data(), dq_.data(),
                   q_new_.data(), l2_terms_.data(), l2c_.data(), s);
  T* cur = buf_a_.data();
  T* other = buf_b_.data();
  const T* x = acts_[sz(start)].data();
  bool shared = true;  // x is the incumbent's, the same for every candidate
  if (start < 0) {
    // The materialised path: every candidate from its own copy of the inputs.
    start = 0;
    launch_broadcast<T>(acts_[0].data(), batch_, plan_.in_features, count, cur, s);
    x = cur;
    shared = false;
  }
  for (std::size_t i = sz(start); i < plan_.ops.size(); ++i) {
    const OpPlan& op = plan_.ops[i];
    if (op.op == PP_OP_ACTIVATION) {
      if (shared) {  // the incumbent's own output
        x = acts_[i + 1].data();
        continue;
      }
      if (op.fn != PP_ACT_IDENTITY)
        launch_activation<T>(cur, cur, rows * op.out, op.fn, op.step, s);
      continue;
    }
    const bool changed = static_cast<int32_t>(i) >= first && static_cast<int32_t>(i) <= last;
    if (site && changed && op.op == PP_OP_LINEAR) {
      const int64_t n = batch_ * op.positions;
      launch_broadcast<T>(acts_[i + 1].data(), n, op.out, count, other, s);
      launch_correct<T>(src, t, count, static_cast<int32_t>(i), dq_.data(), acts_[i].data(), 0,
                        op.in, other, op.out, n, s);
      std::swap(cur, other);
      x = cur;
      shared = false;
      continue;
    }
    if (site && changed && !conv_tails_.empty() && conv_tails_[i].outputs > 0) {
      // The moved channels go through the channel-local ops into the linear op's output.
      const auto j = sz(conv_tail_to_[i]);
      const ConvTail& tail = conv_tails_[i];
      site_buf_.reserve(sz(rows * conv_tail_scratch_per_sample(tail)));
      const SiteTable sites{site_kind_d_.data(), site_n_d_.data(), site_sites_d_.data()};
      launch_site_conv_tail<T>(op.layer, tail, src, t, sites, count, batch_, acts_[i].data(),
                               eff_d_.data() + op.param_offset, op.param_offset, q_new_.data(),
                               acts_[j].data(), eff_d_.data() + plan_.ops[j].param_offset,
                               acts_[j + 1].data(), site_buf_.data(), other, s);
      std::swap(cur, other);
      x = cur;
      shared = false;
      i = j;
      continue;
    }
    if (site && changed && !carries_.empty() && carries_[i].outputs > 0) {
      // The block's change goes straight into the next linear op's output.
      const auto j = sz(carry_to_[i]);
      site_buf_.reserve(sz(rows * site_scratch_per_sample(op.layer)));
      const SiteTable sites{site_kind_d_.data(), site_n_d_.data(), site_sites_d_.data()};
      launch_site_cheri_carry<T>(op.layer, src, t, sites, count, batch_, acts_[i].data(),
                                 inc_scratch_[i].data(), cheri_views_[i].data(),
                                 eff_d_.data() + op.param_offset, op.param_offset, q_new_.data(),
                                 site_buf_.data(), carries_[i], acts_[j + 1].data(), other, s);
      std::swap(cur, other);
      x = cur;
      shared = false;
      i = j;
      continue;
    }
    if (site && changed) {
      site_buf_.reserve(sz(rows * site_scratch_per_sample(op.layer)));
      std::string declined;
      const SiteTable sites{site_kind_d_.data(), site_n_d_.data(), site_sites_d_.data()};
      launch_site_op<T>(
          op.layer, src, t, sites, count, batch_, acts_[i].data(), acts_[i + 1].data(),
          inc_scratch_.empty() ? nullptr : inc_scratch_[i].data(),
          cheri_views_.empty() ? nullptr : cheri_views_[i].data(), eff_d_.data() + op.param_offset,
          op.param_offset, q_new_.data(), site_buf_.data(), other, s, &declined);
      if (!declined.empty()) note_declined(i, declined);
      std::swap(cur, other);
      x = cur;
      shared = false;
      continue;
    }
    const int64_t block = block_of(op);
    const T* params = eff_d_.data() + op.param_offset;
    int64_t param_stride = 0;
    if (changed) {
      launch_materialise<T>(src, t, count, static_cast<int32_t>(i), params, op.param_offset, block,
                            q_new_.data(), w_cand_.data(), s);
      params = w_cand_.data();
      param_stride = block;
    }
    if (op.op != PP_OP_LINEAR) {
      const LayerIo<T> io{x,      shared ? 1 : 0, batch_, rows,
                          params, param_stride,   other,  scratch_.data()};
      layer_op(i, io, s);
    } else if (changed || shared) {
      // Each candidate's weights (or the incumbent's, on the shared input): one strided
      // batched GEMM over the candidates, `positions` rows per sample.
      const int64_t n = batch_ * op.positions;
      gemm_batched<T>(blas_.get(), static_cast<int>(op.out), static_cast<int>(n),
                      static_cast<int>(op.in), params, param_stride, x, shared ? 0 : n * op.in,
                      other, n * op.out, static_cast<int>(count));
      if (op.bias && changed)
        launch_batched_bias<T>(other, w_cand_.data(), block, op.out * op.in, n, op.out, count, s);
      else if (op.bias)
        launch_add_bias<T>(other, params + op.out * op.in, rows * op.positions, op.out, s);
    } else {
      linear(i, cur, rows * op.positions, other);
    }
    std::swap(cur, other);
    x = cur;
    shared = false;
  }
  if (shared) {  // no op ran: every candidate is the incumbent
    launch_broadcast<T>(x, batch_, plan_.out_features, count, cur, s);
  }
  launch_sample_losses<T>(cur, rows, plan_.out_features, batch_, static_cast<int32_t>(plan_.loss),
                          labels_d_.data(), targets_d_.data(), per_.data(), s);
  launch_objective<T>(src, count, per_.data(), batch_, plan_.l2, sum_sq_, l2c_.data(),
                      losses_d_.data(), s);
}

// The members defined here, for both compute types.
template void DeviceSession<float>::run_dense_chunk(const CandidateSource& src, int64_t count,
                                                    int32_t start, int32_t first, int32_t last,
                                                    bool site);
template void DeviceSession<double>::run_dense_chunk(const CandidateSource& src, int64_t count,
                                                     int32_t start, int32_t first, int32_t last,
                                                     bool site);

}  // namespace polyprobe::cuda
