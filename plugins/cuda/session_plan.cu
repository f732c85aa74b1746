// What each particle of a CUDA session runs, planned with the particles: the fused tails,
// the site-local carries and conv tails, and the runs of equal chunk keys (session_impl.cuh).
#include "session_impl.cuh"

namespace polyprobe::cuda {

// The Cheri blocks whose output feeds a linear op through identities alone: their
// site-local candidates carry their change into that op (site_local.cuh, CheriCarry).
template <class T>
void DeviceSession<T>::plan_carries() {
  carries_.assign(plan_.ops.size(), CheriCarry<T>{});
  carry_to_.assign(plan_.ops.size(), -1);
  carry_u_.resize(plan_.ops.size());
  for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
    if (plan_.ops[i].op != PP_OP_CHERI_BLOCK) continue;
    std::size_t j = i + 1;
    while (j < plan_.ops.size() && plan_.ops[j].op == PP_OP_ACTIVATION &&
           plan_.ops[j].fn == PP_ACT_IDENTITY)
      ++j;
    const pp_cheri_attrs& a = plan_.ops[i].layer.cheri;
    if (j == plan_.ops.size() || plan_.ops[j].op != PP_OP_LINEAR) continue;
    const OpPlan& next = plan_.ops[j];
    if (next.in % a.channels != 0 || a.length % (next.in / a.channels) != 0) continue;
    carries_[i].per_row = next.in / a.channels;
    carries_[i].rows = a.length / carries_[i].per_row;
    carries_[i].outputs = next.out;
    carry_to_[i] = static_cast<int32_t>(j);
  }
}

// The conv ops whose output reaches a linear op through channel-local ops alone
// (site_local.cuh, ConvTail). Not where rounding decides (the 0-1 loss, a sign or staircase
// after the linear op): the tail adds a change where the dense path recomputes the sum.
template <class T>
void DeviceSession<T>::plan_conv_tails() {
  conv_tails_.assign(plan_.ops.size(), ConvTail{});
  conv_tail_to_.assign(plan_.ops.size(), -1);
  if (plan_.loss == kernels::LossKind::zero_one) return;
  for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
    if (plan_.ops[i].op != PP_OP_CONV) continue;
    const pp_conv_attrs& a = plan_.ops[i].layer.conv;
    ConvTail tail;
    int64_t per_channel = a.out_size[0] * a.out_size[1];
    std::size_t j = i + 1;
    bool ok = true;
    for (; ok && j < plan_.ops.size(); ++j) {
      const OpPlan& op = plan_.ops[j];
      if (op.op == PP_OP_ACTIVATION) {
        if (op.fn == PP_ACT_IDENTITY) continue;
        ActivationChain& chain = tail.pooled != 0 ? tail.after : tail.before;
        if (chain.n == kFusedMaxChain) ok = false;
        if (ok) chain.fn[chain.n] = op.fn, chain.step[chain.n++] = op.step;
      } else if (op.op == PP_OP_POOL && tail.pooled == 0 && tail.after.n == 0) {
        const pp_pool_attrs& pl = op.layer.pool;
        ok = pl.channels == a.out_channels && pl.in_size[0] == a.out_size[0] &&
             pl.in_size[1] == a.out_size[1];
        tail.pooled = 1;
        tail.pool = pl;
        per_channel = pl.out_size[0] * pl.out_size[1];
      } else {
        break;
      }
    }
    if (!ok || j == plan_.ops.size() || plan_.ops[j].op != PP_OP_LINEAR) continue;
    const OpPlan& next = plan_.ops[j];
    if (next.positions != 1 || next.in != a.out_channels * per_channel) continue;
    bool steps_after = false;
    for (std::size_t k = j + 1; k < plan_.ops.size(); ++k)
      steps_after =
          steps_after || (plan_.ops[k].op == PP_OP_ACTIVATION &&
                          (plan_.ops[k].fn == PP_ACT_SIGN || plan_.ops[k].fn == PP_ACT_STAIRCASE));
    if (steps_after) continue;
    tail.per_channel = per_channel;
    tail.outputs = next.out;
    conv_tails_[i] = tail;
    conv_tail_to_[i] = static_cast<int32_t>(j);
  }
}

// The most site-buffer values one sample of a chunk needs.
template <class T>
int64_t DeviceSession<T>::site_scratch_max() const {
  int64_t widest = 0;
  for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
    widest = std::max(widest, site_scratch_per_sample(plan_.ops[i].layer));
    if (!conv_tails_.empty())
      widest = std::max(widest, conv_tail_scratch_per_sample(conv_tails_[i]));
  }
  return widest;
}

// run_end_[p]: one past the last particle of the run of equal chunk keys that holds p;
// run_last_[p]: the last op any particle of [p, run_end_[p]) changes.
template <class T>
void DeviceSession<T>::plan_runs() {
  run_end_.assign(sz(particles_), particles_);
  run_last_.assign(sz(particles_), -1);
  for (int64_t p = particles_ - 1; p >= 0; --p) {
    const bool joined = p + 1 < particles_ && chunk_key(p + 1) == chunk_key(p);
    run_end_[sz(p)] = joined ? run_end_[sz(p + 1)] : p + 1;
    run_last_[sz(p)] = std::max(last_op_[sz(p)], joined ? run_last_[sz(p + 1)] : -1);
  }
}

// Appends the activations from op i on to `chain`; returns the first op that is not one.
template <class T>
std::size_t DeviceSession<T>::read_chain(std::size_t i, ActivationChain& chain, bool& ok) const {
  chain.n = 0;
  for (; i < plan_.ops.size() && plan_.ops[i].op == PP_OP_ACTIVATION; ++i) {
    if (plan_.ops[i].fn == PP_ACT_IDENTITY) continue;
    if (chain.n == kFusedMaxChain) {
      ok = false;
      return i;
    }
    chain.fn[chain.n] = plan_.ops[i].fn;
    chain.step[chain.n] = plan_.ops[i].step;
    ++chain.n;
  }
  return i;
}

template <class T>
void DeviceSession<T>::plan_tails() {
  tails_.assign(plan_.ops.size(), TailPlan{});
  if (plan_.layered_kinds) return;  // the dense path serves these models
  const bool outputs_fit = plan_.out_features <= kFusedMaxOutputs;
  const bool zero_one = plan_.loss == kernels::LossKind::zero_one;
  for (std::size_t l = 0; l < plan_.ops.size() && outputs_fit; ++l) {
    if (plan_.ops[l].op != PP_OP_LINEAR) continue;
    TailPlan t;
    bool ok = true;
    std::size_t i = read_chain(l + 1, t.f1, ok);
    if (i == plan_.ops.size()) {
      t.ok = ok && t.f1.n == 0;  // no activation after the output
      t.hidden = -1;
    } else {
      t.m1 = static_cast<int32_t>(i);
      std::size_t j = read_chain(i + 1, t.f2, ok);
      if (j == plan_.ops.size()) {
        t.ok = ok && t.f2.n == 0;
        t.hidden = 0;
      } else if (plan_.ops[j].op == PP_OP_LINEAR && j + 1 == plan_.ops.size()) {
        t.ok = ok && !discontinuous(t.f2);
        t.hidden = 1;
        t.m2 = static_cast<int32_t>(j);
      }
    }
    if (zero_one && t.hidden >= 0) t.ok = false;
    tails_[l] = t;
  }
}

// Per particle: its rank-one terms and fused mode, or -1 for the general path.
template <class T>
void DeviceSession<T>::build_fused_terms() {
  fused_mode_.assign(sz(particles_), -1);
  std::vector<int64_t> begin{0};
  std::vector<FusedTerm> terms;
  std::vector<uint8_t> dense(sz(particles_), 0);
  std::map<std::pair<int32_t, int64_t>, int32_t> vx_index;  // (op, v offset) -> row
  vx_rows_.assign(plan_.ops.size(), {});
  for (int64_t p = 0; p < particles_; ++p) {
    std::vector<FusedTerm> mine;
    int32_t op = -1;
    bool ok = true, is_dense = false;
    for (int32_t j = 0; j < d_ && ok; ++j) {
      const int64_t k = coords_h_[sz(p * d_ + j)];
      if (k < 0) continue;
      FusedTerm term{j, -1, 0, -1, PP_TRANSFORM_IDENTITY, -1};
      int64_t offset = k;
      if (subspace_ != nullptr) offset = subspace_->coords[k].offset;
      const int32_t o = offset < plan_.n_params ? plan_.owner[sz(offset)] : -1;
      if (o < 0 || (op >= 0 && o != op) || !tails_[sz(o)].ok) {
        ok = false;
        break;
      }
      op = o;
      const OpPlan& lin = plan_.ops[sz(o)];
      const int64_t weights = lin.out * lin.in, local = offset - lin.param_offset;
      if (subspace_ == nullptr) {
        term.raw = k;
        if (local < weights) {
          term.unit = static_cast<int32_t>(local / lin.in);
          term.source = static_cast<int32_t>(local % lin.in);
          term.transform = lin.weight_transform;
        } else {
          term.unit = static_cast<int32_t>(local - weights);
          term.transform = lin.bias_transform;
        }
      } else {
        const pp_subspace_coord& q = subspace_->coords[k];
        const DeviceCoord& dq = sub_coords_h_[sz(k)];
        ok = lin.weight_transform == PP_TRANSFORM_IDENTITY &&
             lin.bias_transform == PP_TRANSFORM_IDENTITY;
        if (local == 0 && q.rows == lin.out && q.cols == lin.in) {  // the weight
          term.unit = static_cast<int32_t>(q.row);
          term.u = dq.u;
          if (q.col >= 0) {
            term.source = static_cast<int32_t>(q.col);
          } else {
            auto [it, fresh] =
                vx_index.try_emplace({o, dq.v}, static_cast<int32_t>(vx_rows_[sz(o)].size()));
            if (fresh) vx_rows_[sz(o)].push_back(dq.v);
            term.source = -it->second - 2;
          }
        } else if (local >= weights && q.cols == 1 && q.row >= 0 && q.col == 0) {  // a bias
          term.unit = static_cast<int32_t>(local - weights + q.row);
        } else {
          ok = false;
        }
      }
      is_dense = is_dense || term.unit < 0;
      mine.push_back(term);
    }
    const TailPlan* tail = op >= 0 ? &tails_[sz(op)] : nullptr;
    ok = ok && tail != nullptr && !mine.empty() && mine.size() <= sz(kFusedMaxTerms);
    if (ok) {
      std::stable_sort(mine.begin(), mine.end(),
                       [](const FusedTerm& a, const FusedTerm& b) { return a.unit < b.unit; });
      terms.insert(terms.end(), mine.begin(), mine.end());
      const bool staged =
          fused_dense_shared_bytes(plan_.ops[sz(op)].out, plan_.out_features, sizeof(T)) <=
          device_properties().shared_per_block;
      int64_t units = 0;
      for (std::size_t e = 0; e < mine.size(); ++e)
        units += e == 0 || mine[e].unit != mine[e - 1].unit ? 1 : 0;
      const bool few = !is_dense && units <= kHiddenUnits;
      fused_mode_[sz(p)] = tail->hidden < 1 ? (is_dense && staged ? 3
                                               : few              ? 5
                                                                  : 0)
                           : is_dense       ? 2
                           : few            ? 4
                                            : 1;
      dense[sz(p)] = is_dense ? 1 : 0;
    }
    begin.push_back(static_cast<int64_t>(terms.size()));
  }
  if (forced_dense_) std::fill(fused_mode_.begin(), fused_mode_.end(), -1);
  // A hidden tail of dense changes (mode 2: a subspace's dense directions) multiplies the
  // whole hidden layer per candidate, a float32 GEMM over the chunk: with autocast that
  // product runs in the reduced precision instead. Sparse changes (mode 1: a few units)
  // stay fused: their rank-one update costs less than any GEMM (measured: routing them
  // to the GEMMs made mlp256-full's evaluation 1.3x slower on the H200).
  if (autocast_ != 0)
    for (int32_t& m : fused_mode_)
      if (m == 2) m = -1;
  cudaStream_t s = stream_.get();
  term_begin_d_.upload(begin.data(), begin.size(), s);
  terms_d_.upload(terms.data(), terms.size(), s);
  dense_d_.upload(dense.data(), dense.size(), s);
  vx_t_.resize(plan_.ops.size());
  vx_offsets_d_.resize(plan_.ops.size());
  for (std::size_t o = 0; o < plan_.ops.size(); ++o)
    vx_offsets_d_[o].upload(vx_rows_[o].data(), vx_rows_[o].size(), s);
  // The directions of the ops the factored_correction operation projects, as [n_v, in] in T.
  // Same sizes as the last binding keep their buffers (resize allocates only on a change:
  // a cudaFree would wait for the device).
  vx_dirs_d_.resize(plan_.ops.size());
  std::vector<T> dirs;
  for (std::size_t o = 0; o < plan_.ops.size(); ++o) {
    if (correction_ == nullptr || vx_rows_[o].size() < sz(kMinSharedDirections)) {
      vx_dirs_d_[o].resize(0);
      continue;
    }
    const int64_t in = plan_.ops[o].in;
    dirs.resize(vx_rows_[o].size() * sz(in));
    for (std::size_t j = 0; j < vx_rows_[o].size(); ++j)
      for (int64_t i = 0; i < in; ++i)
        dirs[j * sz(in) + sz(i)] = static_cast<T>(basis_h_[sz(vx_rows_[o][j] + i)]);
    vx_dirs_d_[o].upload(dirs.data(), dirs.size(), s);
  }
  stream_.synchronize();
  prefix_dirty_ = true;  // the dense v products are computed with the prefix
}

// The members defined here, for both compute types.
template void DeviceSession<float>::plan_carries();
template void DeviceSession<double>::plan_carries();
template void DeviceSession<float>::plan_conv_tails();
template void DeviceSession<double>::plan_conv_tails();
template int64_t DeviceSession<float>::site_scratch_max() const;
template int64_t DeviceSession<double>::site_scratch_max() const;
template void DeviceSession<float>::plan_runs();
template void DeviceSession<double>::plan_runs();
template std::size_t DeviceSession<float>::read_chain(std::size_t i, ActivationChain& chain,
                                                      bool& ok) const;
template std::size_t DeviceSession<double>::read_chain(std::size_t i, ActivationChain& chain,
                                                       bool& ok) const;
template void DeviceSession<float>::plan_tails();
template void DeviceSession<double>::plan_tails();
template void DeviceSession<float>::build_fused_terms();
template void DeviceSession<double>::build_fused_terms();

}  // namespace polyprobe::cuda
