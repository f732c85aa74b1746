// The fused-tail path of a CUDA session: a candidate from its changed op to its loss in one
// kernel (fused_tail.cuh), and the incumbent's transposed inputs it reads (session_impl.cuh).
#include "session_impl.cuh"

namespace polyprobe::cuda {

// The incumbent's activations transposed (one sample per thread reads them coalesced)
// and the dense v products of each op's input.
template <class T>
void DeviceSession<T>::refresh_fused_inputs() {
  cudaStream_t s = stream_.get();
  acts_t_.resize(acts_.size());
  for (std::size_t i = 0; i < acts_.size(); ++i) {
    const int64_t width = i == 0 ? plan_.in_features : plan_.ops[i - 1].out;
    acts_t_[i].resize(sz(batch_ * width));
    launch_transpose<T>(acts_[i].data(), batch_, width, acts_t_[i].data(), s);
  }
  // The effective weights of the ops a hidden tail streams through, transposed.
  weights_t_.resize(plan_.ops.size());
  for (const TailPlan& tp : tails_) {
    if (!tp.ok || tp.hidden != 1) continue;
    const int32_t streamed[2] = {tp.m1, tp.m2};
    for (const int32_t m : streamed) {
      const OpPlan& op = plan_.ops[sz(m)];
      weights_t_[sz(m)].resize(sz(op.out * op.in));
      launch_transpose<T>(eff_d_.data() + op.param_offset, op.out, op.in, weights_t_[sz(m)].data(),
                          s);
    }
  }
  for (std::size_t o = 0; o < vx_rows_.size() && o < vx_t_.size(); ++o) {
    const auto n_v = static_cast<int64_t>(vx_rows_[o].size());
    if (n_v == 0) continue;
    vx_t_[o].resize(sz(n_v * batch_));
    if (o < vx_dirs_d_.size() && vx_dirs_d_[o].size() > 0) {
      pp_factored_project_args a{};
      a.struct_size = sizeof(a);
      a.dtype = sizeof(T) == 4 ? PP_DTYPE_F32 : PP_DTYPE_F64;
      a.samples = batch_;
      a.width = plan_.ops[o].in;
      a.n_dirs = n_v;
      a.x = acts_[o].data();
      a.x_stride = plan_.ops[o].in;
      a.dirs = vx_dirs_d_[o].data();
      a.dirs_stride = plan_.ops[o].in;
      a.out = vx_t_[o].data();
      a.out_stride = batch_;
      a.stream = s;
      pp_error err{};
      if (correction_->project(&a, &err) != PP_OK)
        throw std::runtime_error("the factored_correction operation (" + correction_provider_ +
                                 ") failed: " + err.message);
      continue;
    }
    launch_dense_v<T>(basis_d_.data(), vx_offsets_d_[o].data(), n_v, acts_[o].data(), batch_,
                      plan_.ops[o].in, vx_t_[o].data(), s);
  }
}

template <class T>
void DeviceSession<T>::run_fused_chunk(const CandidateSource& src, int64_t count, int32_t l,
                                       int32_t mode) {
  cudaStream_t s = stream_.get();
  const TailPlan& tp = tails_[sz(l)];
  const OpPlan& op = plan_.ops[sz(l)];
  per_.reserve(sz(count * batch_));
  FusedTail<T> t{};
  t.term_begin = term_begin_d_.data();
  t.terms = terms_d_.data();
  t.dense = dense_d_.data();
  t.basis = basis_d_.data();
  t.theta = theta_d_.data();
  t.eff = eff_d_.data();
  t.quant_step = op.quant_step;
  t.batch = batch_;
  t.out_l = op.out;
  t.x_t = acts_t_[sz(l)].data();
  t.vx_t = sz(l) < vx_t_.size() ? vx_t_[sz(l)].data() : nullptr;
  t.z_t = acts_t_[sz(l) + 1].data();
  t.f1 = tp.f1;
  t.hidden = tp.hidden;
  if (tp.m1 >= 0) {
    const OpPlan& m1 = plan_.ops[sz(tp.m1)];
    t.w_m1 = eff_d_.data() + m1.param_offset;
    t.width_m1 = m1.out;
    t.z1_t = acts_t_[sz(tp.m1) + 1].data();
  }
  if (tp.m2 >= 0) {
    t.f2 = tp.f2;
    t.w_m1_t = weights_t_[sz(tp.m1)].data();
    t.w_m2_t = weights_t_[sz(tp.m2)].data();
  }
  t.logits_t = acts_t_.back().data();
  t.outputs = plan_.out_features;
  t.loss = static_cast<int32_t>(plan_.loss);
  t.labels = labels_d_.data();
  t.targets = targets_d_.data();
  if (mode == 2) {
    // dh of op l per (candidate, sample), its product with m1's weights as one GEMM, then
    // m1's units into the logits.
    const int64_t rows = count * batch_;
    buf_a_.reserve(sz(rows * plan_.max_width));
    buf_b_.reserve(sz(rows * plan_.max_width));
    launch_dense_change<T>(src, t, count, buf_a_.data(), s);
    gemm<T>(blas_.get(), static_cast<int>(t.width_m1), static_cast<int>(rows),
            static_cast<int>(t.out_l), t.w_m1, buf_a_.data(), buf_b_.data());
    launch_hidden_change<T>(t, count, buf_b_.data(), per_.data(), s);
  } else {
    launch_fused_tail<T>(src, t, count, mode, per_.data(), s);
  }
  const double* l2_delta = nullptr;
  if (plan_.l2 != 0.0) {
    // The raw parameters' l2 change, as the general path computes it.
    dq_.reserve(sz(count * elem_max_));
    l2_terms_.reserve(sz(count * elem_max_));
    l2c_.reserve(sz(count));
    launch_deltas<T>(src, table(), count, theta_d_.data(), ops_d_.data(), eff_d_.data(), dq_.data(),
                     nullptr, l2_terms_.data(), l2c_.data(), s);
    l2_delta = l2c_.data();
  }
  launch_objective<T>(src, count, per_.data(), batch_, plan_.l2, sum_sq_, l2_delta,
                      losses_d_.data(), s);
  ++fused_chunks_;
}

// The members defined here, for both compute types.
template void DeviceSession<float>::refresh_fused_inputs();
template void DeviceSession<double>::refresh_fused_inputs();
template void DeviceSession<float>::run_fused_chunk(const CandidateSource& src, int64_t count,
                                                    int32_t l, int32_t mode);
template void DeviceSession<double>::run_fused_chunk(const CandidateSource& src, int64_t count,
                                                     int32_t l, int32_t mode);

}  // namespace polyprobe::cuda
