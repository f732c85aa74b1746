// The layered sparse / subspace-delta path of a CUDA session: the first changed op corrected
// from the incumbent's output, the later ops as GEMMs over the chunk, and its autocast form
// (session_impl.cuh).
#include "session_impl.cuh"

namespace polyprobe::cuda {

// The layered paths' common start: the chunk's buffers, and each candidate's moved effective
// parameters (dq) and L2 terms.
template <class T>
ParticleTable DeviceSession<T>::start_layered_chunk(const CandidateSource& src, int64_t count) {
  const int64_t rows = count * batch_;
  buf_a_.reserve(sz(rows * plan_.max_width));
  buf_b_.reserve(sz(rows * plan_.max_width));
  per_.reserve(sz(rows));
  dq_.reserve(sz(count * elem_max_));
  l2_terms_.reserve(sz(count * elem_max_));
  l2c_.reserve(sz(count));
  const ParticleTable t = table();
  launch_deltas<T>(src, t, count, theta_d_.data(), ops_d_.data(), eff_d_.data(), dq_.data(),
                   nullptr, l2_terms_.data(), l2c_.data(), stream_.get());
  return t;
}

template <class T>
void DeviceSession<T>::run_chunk(const CandidateSource& src, int64_t count, int32_t first,
                                 int32_t last) {
  cudaStream_t s = stream_.get();
  const int64_t rows = count * batch_;
  const ParticleTable t = start_layered_chunk(src, count);
  T* cur = buf_a_.data();
  T* other = buf_b_.data();
  const OpPlan& f = plan_.ops[sz(first)];
  // Prefix reuse: the first changed op starts from the incumbent's own output and input.
  launch_broadcast<T>(acts_[sz(first) + 1].data(), batch_, f.out, count, cur, s);
  launch_correct<T>(src, t, count, first, dq_.data(), acts_[sz(first)].data(), 0, f.in, cur, f.out,
                    batch_, s);
  for (std::size_t i = sz(first) + 1; i < plan_.ops.size(); ++i) {
    const OpPlan& op = plan_.ops[i];
    if (op.op == PP_OP_ACTIVATION) {
      if (op.fn != PP_ACT_IDENTITY)
        launch_activation<T>(cur, cur, rows * op.out, op.fn, op.step, s);
      continue;
    }
    linear(i, cur, rows, other);
    if (static_cast<int32_t>(i) <= last)
      launch_correct<T>(src, t, count, static_cast<int32_t>(i), dq_.data(), cur, batch_ * op.in,
                        op.in, other, op.out, batch_, s);
    std::swap(cur, other);
  }
  launch_sample_losses<T>(cur, rows, plan_.out_features, batch_, static_cast<int32_t>(plan_.loss),
                          labels_d_.data(), targets_d_.data(), per_.data(), s);
  launch_objective<T>(src, count, per_.data(), batch_, plan_.l2, sum_sq_, l2c_.data(),
                      losses_d_.data(), s);
}

// candidate_autocast (autocast.cuh): the chunk's candidates as changes from the incumbent.
// Op `first` is the only op they change: its change is the sparse correction alone; each
// activation maps the change of its input to the change of its output in float32; each
// later linear op is one reduced-precision GEMM of the change (no bias: it cancels).
template <class T>
void DeviceSession<T>::run_autocast_chunk(const CandidateSource& src, int64_t count,
                                          int32_t first) {
  if constexpr (!std::is_same_v<T, float>) {
    throw std::logic_error("candidate_autocast in a float64 session");
  } else {
    cudaStream_t s = stream_.get();
    const int64_t rows = count * batch_;
    x_reduced_.reserve(sz(rows * plan_.max_width));
    const ParticleTable t = start_layered_chunk(src, count);
    float* cur = buf_a_.data();
    float* other = buf_b_.data();
    const OpPlan& f = plan_.ops[sz(first)];
    check(cudaMemsetAsync(cur, 0, sz(rows * f.out) * sizeof(float), s), "cudaMemsetAsync");
    launch_correct<T>(src, t, count, first, dq_.data(), acts_[sz(first)].data(), 0, f.in, cur,
                      f.out, batch_, s);
    bool reduced_ready = false;  // x_reduced_ holds the change `cur` in the reduced dtype
    for (std::size_t i = sz(first) + 1; i < plan_.ops.size(); ++i) {
      const OpPlan& op = plan_.ops[i];
      if (op.op == PP_OP_ACTIVATION) {
        if (op.fn == PP_ACT_IDENTITY) continue;
        std::size_t next = i + 1;
        while (next < plan_.ops.size() && plan_.ops[next].op == PP_OP_ACTIVATION &&
               plan_.ops[next].fn == PP_ACT_IDENTITY)
          ++next;
        // Feeding a GEMM, the change is written in the reduced dtype only.
        reduced_ready = next < plan_.ops.size() && plan_.ops[next].op == PP_OP_LINEAR;
        launch_activation_change(cur, acts_[i].data(), acts_[i + 1].data(), batch_ * op.out, count,
                                 op.fn, op.step, cur, reduced_ready ? x_reduced_.data() : nullptr,
                                 autocast_, s);
        continue;
      }
      if (!reduced_ready) launch_to_reduced(cur, x_reduced_.data(), rows * op.in, autocast_, s);
      gemm_reduced(blas_.get(), static_cast<int>(op.out), static_cast<int>(rows),
                   static_cast<int>(op.in), w_reduced_.data() + op.param_offset, x_reduced_.data(),
                   autocast_, other);
      reduced_ready = false;
      std::swap(cur, other);
    }
    launch_add_incumbent(cur, acts_.back().data(), batch_ * plan_.out_features, count, s);
    launch_sample_losses<T>(cur, rows, plan_.out_features, batch_, static_cast<int32_t>(plan_.loss),
                            labels_d_.data(), targets_d_.data(), per_.data(), s);
    launch_objective<T>(src, count, per_.data(), batch_, plan_.l2, sum_sq_, l2c_.data(),
                        losses_d_.data(), s);
    autocast_candidates_ += count;
  }
}

// The members defined here, for both compute types.
template ParticleTable DeviceSession<float>::start_layered_chunk(const CandidateSource& src,
                                                                 int64_t count);
template ParticleTable DeviceSession<double>::start_layered_chunk(const CandidateSource& src,
                                                                  int64_t count);
template void DeviceSession<float>::run_chunk(const CandidateSource& src, int64_t count,
                                              int32_t first, int32_t last);
template void DeviceSession<double>::run_chunk(const CandidateSource& src, int64_t count,
                                               int32_t first, int32_t last);
template void DeviceSession<float>::run_autocast_chunk(const CandidateSource& src, int64_t count,
                                                       int32_t first);
template void DeviceSession<double>::run_autocast_chunk(const CandidateSource& src, int64_t count,
                                                        int32_t first);

}  // namespace polyprobe::cuda
