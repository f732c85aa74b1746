// A CUDA session's score call: the incumbent's prefix, the candidates cut into chunks of
// one path each, the losses (session_impl.cuh).
#include "session_impl.cuh"

namespace polyprobe::cuda {

template <class T>
void DeviceSession<T>::score(const pp_score_request& request, double* losses,
                             double* incumbent_loss) {
  use_device();
  if (batch_ == 0) throw std::logic_error("score before set_batch");
  if (theta_h_.empty() && plan_.n_params > 0) throw std::logic_error("score before set_incumbent");
  cudaStream_t s = stream_.get();
  CandidateSource src{};
  src.d = d_;
  int64_t count = 0, outputs = 0;
  std::vector<int64_t> active;
  bool all_active = false;
  if (request.form == PP_CANDIDATES_POLYTOPE) {
    if (!has_particles_ || vertices_ <= 0)
      throw std::logic_error("score: the bound particles have no polytope");
    for (int64_t p = 0; p < particles_; ++p)
      if (request.active == nullptr || request.active[p] != 0) active.push_back(p);
    step_bytes_up_ = 0;
    step_bytes_down_ = 0;
    // Every particle active (every step without adaptive probes): the list 0..P-1 is
    // already on the device after the first such step.
    const bool all = static_cast<int64_t>(active.size()) == particles_;
    all_active = all;
    if (!(all && active_is_all_)) {
      active_d_.upload(active.data(), active.size(), s);
      step_bytes_up_ += active.size() * sizeof(int64_t);
    }
    active_is_all_ = all;
    const double* rotations =
        PP_HAS_FIELD(&request, pp_score_request, rotations) ? request.rotations : nullptr;
    const bool from_stream = PP_HAS_FIELD(&request, pp_score_request, rotation_step) &&
                             request.rotations_from_stream != 0;
    if (from_stream) {
      // Drawn here from the optimizer's stream: nothing per particle comes up.
      if (!draws_rotations(d_))
        throw std::invalid_argument("score: rotations of dimension " + std::to_string(d_) +
                                    " are not drawn on the device; send them");
      rot_d_.reserve(sz(particles_ * d_ * d_));
      launch_plane_rotations(request.rotation_seed, request.rotation_step, particles_,
                             rot_d_.data(), s);
      dir_d_.reserve(sz(particles_ * vertices_ * d_));
      launch_directions(rot_d_.data(), polytope_d_.data(), particles_, vertices_, d_, dir_d_.data(),
                        s);
    } else if (rotations != nullptr) {
      // Per particle [P d d] up, the [P V d] directions built here.
      rot_d_.upload(rotations, sz(particles_ * d_ * d_), s);
      step_bytes_up_ += sz(particles_ * d_ * d_) * sizeof(double);
      dir_d_.reserve(sz(particles_ * vertices_ * d_));
      launch_directions(rot_d_.data(), polytope_d_.data(), particles_, vertices_, d_, dir_d_.data(),
                        s);
    } else {
      dir_d_.upload(request.directions, sz(particles_ * vertices_ * d_), s);
      step_bytes_up_ += sz(particles_ * vertices_ * d_) * sizeof(double);
    }
    src.polytope = 1;
    src.active = active_d_.data();
    src.directions = dir_d_.data();
    src.probe_radius = request.probe_radius;
    src.vertices = vertices_;
    src.probes = probes_;
    count = static_cast<int64_t>(active.size()) * vertices_ * probes_;
    outputs = particles_ * vertices_ * probes_;
  } else if (request.form == PP_CANDIDATES_EXPLICIT) {
    count = request.count;
    if (count < 0) throw std::invalid_argument("score: negative candidate count");
    if (count > 0 && !has_particles_) throw std::logic_error("score before set_particles");
    for (int64_t c = 0; c < count; ++c)
      if (request.particle[c] < 0 || request.particle[c] >= particles_)
        throw std::invalid_argument("score: candidate " + std::to_string(c) + " names particle " +
                                    std::to_string(request.particle[c]));
    particle_d_.upload(request.particle, sz(count), s);
    disp_d_.upload(request.displacement, sz(count * d_), s);
    src.particle = particle_d_.data();
    src.displacement = disp_d_.data();
    outputs = count;
  } else {
    throw std::invalid_argument("score: unknown candidate form " + std::to_string(request.form));
  }
  losses_d_.reserve(sz(outputs + 1));
  refresh_prefix();

  const auto particle_of = [&](int64_t g) {
    return src.polytope ? active[sz(g / (int64_t{vertices_} * probes_))] : request.particle[g];
  };
  autocast_candidates_ = 0;
  site_candidates_ = 0;
  int64_t timed = 0;  // chunks timed by chunk_events_ in this call
  int64_t g = 0;
  while (g < count) {
    const int64_t cap = chunk_capacity();
    // A chunk: consecutive candidates whose particles share a chunk key (same first
    // changed op, fused mode, site-local choice and, with autocast, straddling).
    const int32_t first = first_op_[sz(particle_of(g))];
    const int32_t mode = fused_mode_.empty() ? -1 : fused_mode_[sz(particle_of(g))];
    const bool site = site_local(particle_of(g));
    const bool straddles = last_op_[sz(particle_of(g))] > first;
    int32_t last = -1;
    int64_t end = g;
    if (src.polytope && all_active) {
      // Every particle scored in order: the runs of equal keys planned with the particles
      // give the chunk's end without visiting its candidates.
      const int64_t vk = int64_t{vertices_} * probes_;
      const int64_t pb = g / vk;
      end = std::min({count, g + cap, run_end_[sz(pb)] * vk});
      const int64_t pe = (end - 1) / vk + 1;
      if (pe == run_end_[sz(pb)])
        last = run_last_[sz(pb)];
      else
        for (int64_t p = pb; p < pe; ++p) last = std::max(last, last_op_[sz(p)]);
    } else {
      const std::array<int32_t, 4> key = chunk_key(particle_of(g));
      while (end < count && end - g < cap && chunk_key(particle_of(end)) == key) {
        last = std::max(last, last_op_[sz(particle_of(end))]);
        ++end;
      }
    }
    src.first = g;
    if (chunk_events_.size() < sz(2 * timed + 2)) {
      chunk_events_.emplace_back();
      chunk_events_.emplace_back();
      chunk_site_.push_back(0);
    }
    chunk_events_[sz(2 * timed)].record(s);
    try {
      if (mode >= 0)
        run_fused_chunk(src, end - g, first, mode);
      else if (path_ == PathKind::dense || path_ == PathKind::materialised)
        run_dense_chunk(src, end - g, path_ == PathKind::materialised ? -1 : first, first, last,
                        site);
      else if (autocast_ != 0 && !straddles)
        run_autocast_chunk(src, end - g, first);
      else
        run_chunk(src, end - g, first, last);
    } catch (const OutOfMemory&) {
      if (end - g <= 1) throw;
      // Halve and retry; the buffers of the failed size are let go first.
      chunk_cap_ = std::max<int64_t>(1, (end - g) / 2);
      release_chunk_buffers();
      continue;
    }
    if (site) site_candidates_ += end - g;
    chunk_events_[sz(2 * timed + 1)].record(s);
    chunk_site_[sz(timed)] = site ? 1 : 0;
    ++timed;
    g = end;
  }
  if (incumbent_loss != nullptr) incumbent_objective(losses_d_.data() + outputs);
  last_count_ = count;
  timed_chunks_ = timed;

  // A polytope set scored without a loss buffer keeps its losses here for transport();
  // only f(X) comes back. (An explicit set of no candidates has no buffer either.)
  losses_resident_ = losses == nullptr && src.polytope;
  if (losses_resident_) {
    if (incumbent_loss != nullptr) {
      check(cudaMemcpyAsync(incumbent_loss, losses_d_.data() + outputs, sizeof(double),
                            cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync f(X) to host");
      step_bytes_down_ += sizeof(double);
    }
    stream_.synchronize();
    return;
  }
  staging_.resize(sz(outputs + 1));
  check(cudaMemcpyAsync(staging_.data(), losses_d_.data(), sz(outputs + 1) * sizeof(double),
                        cudaMemcpyDeviceToHost, s),
        "cudaMemcpyAsync losses to host");
  step_bytes_down_ += sz(outputs + 1) * sizeof(double);
  stream_.synchronize();
  if (src.polytope) {
    // Entries of inactive particles stay as the caller left them.
    const int64_t vk = int64_t{vertices_} * probes_;
    for (int64_t p : active) std::copy_n(staging_.begin() + p * vk, vk, losses + p * vk);
  } else {
    std::copy_n(staging_.begin(), count, losses);
  }
  if (incumbent_loss != nullptr) *incumbent_loss = staging_[sz(outputs)];
}

template <class T>
ParticleTable DeviceSession<T>::table() {
  ParticleTable t{};
  t.d = d_;
  t.coords = coords_d_.data();
  t.elem_begin = elem_begin_d_.data();
  t.elem_raw = elem_raw_d_.data();
  t.elem_op = elem_op_d_.data();
  t.elem_row = elem_row_d_.data();
  t.elem_col = elem_col_d_.data();
  t.elem_max = elem_max_;
  t.subspace = subspace_ != nullptr ? sub_coords_d_.data() : nullptr;
  t.basis = basis_d_.data();
  return t;
}

// The incumbent's effective weights and its activations at every op boundary.
template <class T>
void DeviceSession<T>::refresh_prefix() {
  if (!prefix_dirty_) return;
  cudaStream_t s = stream_.get();
  launch_effective<T>(theta_d_.data(), owner_d_.data(), ops_d_.data(), plan_.n_params,
                      eff_d_.data(), s);
  if constexpr (std::is_same_v<T, float>) {
    if (autocast_ != 0) {  // the weights in the reduced dtype, once per incumbent
      w_reduced_.resize(sz(plan_.n_params));
      launch_to_reduced(eff_d_.data(), w_reduced_.data(), plan_.n_params, autocast_, s);
    }
  }
  for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
    const OpPlan& op = plan_.ops[i];
    if (op.op == PP_OP_LINEAR) {
      linear(i, acts_[i].data(), batch_ * op.positions, acts_[i + 1].data());
    } else if (op.op == PP_OP_ACTIVATION) {
      launch_activation<T>(acts_[i].data(), acts_[i + 1].data(), batch_ * op.out, op.fn, op.step,
                           s);
    } else {
      // The incumbent's scratch is kept per op: the site-local path reads it.
      inc_scratch_.resize(plan_.ops.size());
      inc_scratch_[i].reserve(sz(batch_ * scratch_per_sample(op.layer)));
      const LayerIo<T> io{acts_[i].data(),
                          0,
                          batch_,
                          batch_,
                          eff_d_.data() + op.param_offset,
                          0,
                          acts_[i + 1].data(),
                          inc_scratch_[i].data()};
      layer_op(i, io, s);
    }
  }
  if (site_local_) {
    cheri_views_.resize(plan_.ops.size());
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      const OpPlan& op = plan_.ops[i];
      if (op.op != PP_OP_CHERI_BLOCK) continue;
      cheri_views_[i].reserve(sz(cheri_views_size(op.layer, batch_)));
      launch_cheri_views<T>(op.layer, batch_, inc_scratch_[i].data(),
                            eff_d_.data() + op.param_offset, cheri_views_[i].data(), blas_.get(),
                            s);
    }
  }
  for (std::size_t i = 0; i < carries_.size(); ++i) {
    CheriCarry<T>& carry = carries_[i];
    if (carry.outputs == 0) continue;
    const OpPlan& block = plan_.ops[i];
    carry_u_[i].reserve(sz(carry.outputs * carry.per_row * block.layer.cheri.expansion *
                           block.layer.cheri.channels));
    carry.w_next = eff_d_.data() + plan_.ops[sz(carry_to_[i])].param_offset;
    carry.u = carry_u_[i].data();
    launch_cheri_carry_weights<T>(block.layer, eff_d_.data() + block.param_offset, carry, s);
  }
  if (!plan_.layered_kinds) refresh_fused_inputs();
  prefix_dirty_ = false;
}

template <class T>
int64_t DeviceSession<T>::bytes_per_candidate() const {
  int64_t bytes = batch_ * (2 * plan_.max_width + 1) * int64_t{sizeof(T)} +
                  elem_max_ * int64_t{sizeof(T) + sizeof(double)} + int64_t{sizeof(double)};
  if (path_ == PathKind::dense || path_ == PathKind::materialised)
    bytes += (largest_block() + elem_max_ + batch_ * largest_scratch()) * int64_t{sizeof(T)};
  if (autocast_ != 0) bytes += batch_ * plan_.max_width * int64_t{kReducedBytes};
  if (site_local_) bytes += batch_ * site_scratch_max() * int64_t{sizeof(T)};
  return bytes;
}

template <class T>
int64_t DeviceSession<T>::chunk_capacity() {
  if (chunk_cap_ > 0) return chunk_cap_;
  int64_t cap = chunk_option_;
  if (cap <= 0) {
    std::size_t free_bytes = 0, total_bytes = 0;
    check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    // Half of what is free now: cuBLAS workspaces and other sessions need room too.
    cap = static_cast<int64_t>(free_bytes / 2) / std::max<int64_t>(1, bytes_per_candidate());
    cap = std::min<int64_t>(cap, int64_t{1} << 20);
  }
  // cuBLAS takes int dimensions: rows = candidates x batch must fit.
  const int64_t rows_limit = (int64_t{1} << 31) - 1;
  cap = std::min(cap, rows_limit / std::max<int64_t>(1, batch_ * plan_.max_width));
  chunk_cap_ = std::max<int64_t>(1, cap);
  return chunk_cap_;
}

template <class T>
void DeviceSession<T>::release_chunk_buffers() {
  w_cand_.resize(0);
  q_new_.resize(0);
  scratch_.resize(0);
  buf_a_.resize(0);
  buf_b_.resize(0);
  per_.resize(0);
  dq_.resize(0);
  l2_terms_.resize(0);
  l2c_.resize(0);
  x_reduced_.resize(0);
  site_buf_.resize(0);
}

template <class T>
void DeviceSession<T>::incumbent_objective(double* slot) {
  per_.reserve(sz(batch_));
  CandidateSource one{};
  launch_sample_losses<T>(acts_.back().data(), batch_, plan_.out_features, batch_,
                          static_cast<int32_t>(plan_.loss), labels_d_.data(), targets_d_.data(),
                          per_.data(), stream_.get());
  launch_objective<T>(one, 1, per_.data(), batch_, plan_.l2, sum_sq_, nullptr, slot, stream_.get());
}

// The members defined here, for both compute types.
template void DeviceSession<float>::score(const pp_score_request& request, double* losses,
                                          double* incumbent_loss);
template void DeviceSession<double>::score(const pp_score_request& request, double* losses,
                                           double* incumbent_loss);
template ParticleTable DeviceSession<float>::table();
template ParticleTable DeviceSession<double>::table();
template void DeviceSession<float>::refresh_prefix();
template void DeviceSession<double>::refresh_prefix();
template int64_t DeviceSession<float>::bytes_per_candidate() const;
template int64_t DeviceSession<double>::bytes_per_candidate() const;
template int64_t DeviceSession<float>::chunk_capacity();
template int64_t DeviceSession<double>::chunk_capacity();
template void DeviceSession<float>::release_chunk_buffers();
template void DeviceSession<double>::release_chunk_buffers();
template void DeviceSession<float>::incumbent_objective(double* slot);
template void DeviceSession<double>::incumbent_objective(double* slot);

}  // namespace polyprobe::cuda
