// The CUDA session's life cycle: construction (the plan, the device, the paths), the batch,
// the particles, the incumbent and its moves, explain (session_impl.cuh).
#include "session_impl.cuh"

namespace polyprobe::cuda {

template <class T>
DeviceSession<T>::DeviceSession(const pp_model_view& model, const pp_loss_view& loss,
                                const pp_session_options& options)
    : plan_(make_plan(model, loss, options)),
      subspace_(options.subspace),
      device_(select_device(options.device_index)),
      stream_(PP_HAS_FIELD(&options, pp_session_options, stream) ? options.stream : nullptr),
      blas_(stream_.get()),
      chunk_option_(options.chunk_size) {
  const char* path = options.path;
  forced_ = path != nullptr && std::string_view(path) != "auto";
  path_ = parse_path(path);
  // Models with the layer_ops.cuh kinds run on the dense path (or the materialised one).
  // So does the 0-1 loss, which rounding decides: where the reference's recomputed outputs
  // tie exactly (quantised weights make that common), an incremental change (the fused
  // tail, the layered correction, a site's carried change) can leave a residue that picks
  // another output; the dense path recomputes each changed layer from its input.
  const bool zero_one = plan_.loss == kernels::LossKind::zero_one;
  if ((plan_.layered_kinds || zero_one) && path_ != PathKind::materialised) path_ = PathKind::dense;
  forced_dense_ = path_ != PathKind::automatic;
  // The site-local path serves the particles of conv, attention and Cheri ops that it can
  // (site_local.cuh) unless a path was forced; the rest of such a model runs densely.
  site_local_ = plan_.layered_kinds && !forced_ && subspace_ == nullptr && !zero_one;
  if (site_local_) {
    plan_carries();
    plan_conv_tails();
  }
  std::vector<OpTransform> ops(plan_.ops.size(), OpTransform{0, 0, 0, 0, 1.0});
  for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
    const OpPlan& op = plan_.ops[i];
    if (op.op == PP_OP_LINEAR)
      ops[i] = {op.param_offset, op.out * op.in, op.weight_transform, op.bias_transform,
                op.quant_step};
    else if (op.param_count > 0)  // layer_ops.cuh kinds use their raw parameters
      ops[i] = {op.param_offset, op.param_count, PP_TRANSFORM_IDENTITY, PP_TRANSFORM_IDENTITY, 1.0};
  }
  ops_d_.upload(ops.data(), ops.size(), stream_.get());
  owner_d_.upload(plan_.owner.data(), plan_.owner.size(), stream_.get());
  attach_sdpa(PP_HAS_FIELD(&options, pp_session_options, host) ? options.host : nullptr);
  attach_correction(PP_HAS_FIELD(&options, pp_session_options, host) ? options.host : nullptr);
  plan_tails();
  theta_d_.resize(sz(plan_.n_params));
  eff_d_.resize(sz(plan_.n_params));
  if (subspace_ != nullptr) upload_subspace();
  stream_.synchronize();
}

template <class T>
void DeviceSession<T>::set_batch(const pp_batch_view& batch) {
  use_device();
  const pp_tensor& in = batch.inputs;
  if (in.dtype != PP_DTYPE_F64 || in.device != PP_DEVICE_CPU || in.ndim != 2)
    throw std::invalid_argument("set_batch: inputs must be a [B, features] float64 host tensor");
  if (in.strides != nullptr && (in.strides[1] != 1 || in.strides[0] != in.shape[1]))
    throw std::invalid_argument("set_batch: inputs must be contiguous row-major");
  const int64_t rows = in.shape[0];
  if (rows <= 0) throw std::invalid_argument("set_batch: the batch is empty");
  if (in.shape[1] != plan_.in_features)
    throw std::invalid_argument("set_batch: inputs have " + std::to_string(in.shape[1]) +
                                " features, the model expects " +
                                std::to_string(plan_.in_features));
  const bool classification = plan_.loss != kernels::LossKind::mse;
  if (classification) {
    if (batch.labels.data == nullptr || batch.labels.dtype != PP_DTYPE_I64 ||
        pp_numel(batch.labels) != rows)
      throw std::invalid_argument("set_batch: this loss needs [B] int64 labels");
    const auto* labels = static_cast<const int64_t*>(batch.labels.data);
    for (int64_t r = 0; r < rows; ++r)
      if (labels[r] < 0 || labels[r] >= plan_.out_features)
        throw std::invalid_argument("set_batch: label " + std::to_string(labels[r]) +
                                    " is out of range");
    labels_d_.upload(labels, sz(rows), stream_.get());
    targets_d_.resize(0);
  } else {
    if (batch.targets.data == nullptr || batch.targets.dtype != PP_DTYPE_F64 ||
        pp_numel(batch.targets) != rows * plan_.out_features)
      throw std::invalid_argument("set_batch: mse needs [B, outputs] float64 targets");
    targets_d_.upload(static_cast<const double*>(batch.targets.data), sz(rows * plan_.out_features),
                      stream_.get());
    labels_d_.resize(0);
  }
  // Converted to the compute dtype once, here, as the core's reference casts its inputs.
  const auto* x = static_cast<const double*>(in.data);
  std::vector<T> converted(sz(rows * plan_.in_features));
  for (std::size_t i = 0; i < converted.size(); ++i) converted[i] = static_cast<T>(x[i]);
  batch_ = rows;
  acts_.resize(plan_.ops.size() + 1);
  acts_[0].upload(converted.data(), converted.size(), stream_.get());
  for (std::size_t i = 0; i < plan_.ops.size(); ++i)
    acts_[i + 1].resize(sz(rows * out_features(plan_.ops[i])));
  // The host vector dies here: the copy must have read it.
  stream_.synchronize();
  prefix_dirty_ = true;
  chunk_cap_ = 0;
}

template <class T>
void DeviceSession<T>::set_particles(const pp_particle_layout& layout) {
  use_device();
  if (layout.d < 1) throw std::invalid_argument("set_particles: d must be at least 1");
  if (layout.n_particles < 0) throw std::invalid_argument("set_particles: negative count");
  if (layout.n_vertices > 0 && layout.n_probes < 1)
    throw std::invalid_argument("set_particles: the probe count must be at least 1");
  const int64_t P = layout.n_particles;
  const int32_t d = layout.d;
  const int64_t limit = subspace_ != nullptr ? subspace_->dimension : plan_.n_params;
  std::vector<int64_t> coords(layout.coords, layout.coords + P * d);
  for (int64_t c : coords)
    if (c >= limit)
      throw std::invalid_argument("set_particles: coordinate " + std::to_string(c) +
                                  " is outside [0, " + std::to_string(limit) + ")");

  std::vector<int64_t> begin{0}, raw;
  std::vector<int32_t> op, row, col;
  std::vector<int32_t> site_kind, site_n, site_sites;
  first_op_.assign(sz(P), first_linear());
  last_op_.assign(sz(P), -1);
  int64_t widest = 1;
  for (int64_t p = 0; p < P; ++p) {
    std::set<int64_t> touched;
    for (int32_t j = 0; j < d; ++j) {
      const int64_t k = coords[sz(p * d + j)];
      if (k < 0) continue;
      if (subspace_ == nullptr) {
        touched.insert(k);
        continue;
      }
      const pp_subspace_coord& q = subspace_->coords[k];
      for (int64_t r = 0; r < q.rows; ++r) {
        const double ur = q.row >= 0 ? (r == q.row ? 1.0 : 0.0) : q.u[r];
        if (ur == 0.0) continue;
        if (q.col >= 0)
          touched.insert(q.offset + r * q.cols + q.col);
        else
          for (int64_t i = 0; i < q.cols; ++i) touched.insert(q.offset + r * q.cols + i);
      }
    }
    int32_t first = -1, last = -1;
    const std::size_t raw_begin = raw.size();
    for (int64_t t : touched) {
      const int32_t o = plan_.owner[sz(t)];
      if (o < 0) continue;  // no parameter of any op: nothing to change
      const OpPlan& lin = plan_.ops[sz(o)];
      const int64_t local = t - lin.param_offset;
      raw.push_back(t);
      op.push_back(o);
      if (lin.op != PP_OP_LINEAR) {  // read by the dense paths only, through raw
        row.push_back(0);
        col.push_back(-1);
      } else if (local < lin.out * lin.in) {
        row.push_back(static_cast<int32_t>(local / lin.in));
        col.push_back(static_cast<int32_t>(local % lin.in));
      } else {
        row.push_back(static_cast<int32_t>(local - lin.out * lin.in));
        col.push_back(-1);
      }
      first = first < 0 ? o : std::min(first, o);
      last = std::max(last, o);
    }
    begin.push_back(static_cast<int64_t>(raw.size()));
    widest = std::max(widest, begin.back() - begin[begin.size() - 2]);
    if (site_local_) {
      SitePlan plan;
      if (first >= 0 && first == last) {
        const OpPlan& o = plan_.ops[sz(first)];
        std::vector<int64_t> local;
        for (std::size_t e = raw_begin; e < raw.size(); ++e)
          local.push_back(raw[e] - o.param_offset);
        if (o.op == PP_OP_LINEAR)
          plan.kind = kSiteLinear;
        else
          plan = plan_site(o.layer, local,
                           !carries_.empty() && carries_[sz(first)].outputs > 0 &&
                               cheri_taps_carry(o.layer, carries_[sz(first)].per_row,
                                                carries_[sz(first)].outputs));
      }
      site_kind.push_back(plan.kind);
      site_n.push_back(plan.n);
      site_sites.insert(site_sites.end(), plan.sites, plan.sites + kSiteMax);
    }
    if (first >= 0) first_op_[sz(p)] = first;
    last_op_[sz(p)] = last;
  }
  cudaStream_t s = stream_.get();
  coords_d_.upload(coords.data(), coords.size(), s);
  elem_begin_d_.upload(begin.data(), begin.size(), s);
  elem_raw_d_.upload(raw.data(), raw.size(), s);
  elem_op_d_.upload(op.data(), op.size(), s);
  elem_row_d_.upload(row.data(), row.size(), s);
  elem_col_d_.upload(col.data(), col.size(), s);
  site_kind_d_.upload(site_kind.data(), site_kind.size(), s);
  site_n_d_.upload(site_n.data(), site_n.size(), s);
  site_sites_d_.upload(site_sites.data(), site_sites.size(), s);
  stream_.synchronize();
  site_kind_h_ = std::move(site_kind);
  // A coordinate that two particles share would make the device move race; then the
  // host's moved mirror is uploaded instead.
  std::vector<int64_t> sorted;
  for (int64_t c : coords)
    if (c >= 0) sorted.push_back(c);
  std::sort(sorted.begin(), sorted.end());
  unique_coords_ = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  coords_h_ = std::move(coords);
  d_ = d;
  particles_ = P;
  vertices_ = layout.n_vertices;
  if (layout.n_vertices > 0 && layout.polytope != nullptr) {
    polytope_d_.upload(layout.polytope, sz(int64_t{layout.n_vertices} * d), s);
    stream_.synchronize();
  }
  losses_resident_ = false;
  active_is_all_ = false;
  probes_ = std::max(1, layout.n_probes);
  elem_max_ = widest;
  has_particles_ = true;
  chunk_cap_ = 0;
  build_fused_terms();
  plan_runs();
}

template <class T>
void DeviceSession<T>::set_incumbent(const pp_tensor& theta) {
  use_device();
  if (theta.dtype != PP_DTYPE_F64 || theta.device != PP_DEVICE_CPU ||
      pp_numel(theta) != plan_.n_params)
    throw std::invalid_argument("set_incumbent: theta must be [" + std::to_string(plan_.n_params) +
                                "] float64 in host memory");
  const auto* data = static_cast<const double*>(theta.data);
  theta_h_.assign(data, data + plan_.n_params);
  theta_d_.upload(theta_h_.data(), theta_h_.size(), stream_.get());
  step_bytes_up_ += theta_h_.size() * sizeof(double);  // a step's move through a subspace
  incumbent_changed();
}

template <class T>
void DeviceSession<T>::move_incumbent(const double* moves) {
  use_device();
  if (theta_h_.empty() && plan_.n_params > 0)
    throw std::logic_error("move_incumbent before set_incumbent");
  if (!has_particles_) throw std::logic_error("move_incumbent before set_particles");
  const int64_t n = particles_ * d_;
  if (subspace_ == nullptr) {
    // The host's arithmetic: theta[coord] += move, in double, on both copies.
    for (int64_t c = 0; c < n; ++c)
      if (coords_h_[sz(c)] >= 0) theta_h_[sz(coords_h_[sz(c)])] += moves[c];
    if (unique_coords_) {
      moves_d_.upload(moves, sz(n), stream_.get());
      step_bytes_up_ += sz(n) * sizeof(double);
      launch_move(coords_d_.data(), moves_d_.data(), n, theta_d_.data(), stream_.get());
    } else {
      theta_d_.upload(theta_h_.data(), theta_h_.size(), stream_.get());
      step_bytes_up_ += theta_h_.size() * sizeof(double);
    }
  } else {
    // RankOneSubspace::apply's order and arithmetic, then the whole mirror goes up, so
    // the device copy is the host's bit for bit.
    for (int64_t c = 0; c < n; ++c) {
      const int64_t k = coords_h_[sz(c)];
      if (k >= 0) kernels::apply_subspace_move(subspace_->coords[k], moves[c], theta_h_.data());
    }
    theta_d_.upload(theta_h_.data(), theta_h_.size(), stream_.get());
    step_bytes_up_ += theta_h_.size() * sizeof(double);
  }
  // moves and theta_h_ are read by the copies above before we return.
  stream_.synchronize();
  incumbent_changed();
}

template <class T>
void DeviceSession<T>::read_incumbent(pp_tensor& theta) {
  use_device();
  if (theta.dtype != PP_DTYPE_F64 || theta.device != PP_DEVICE_CPU ||
      pp_numel(theta) != plan_.n_params)
    throw std::invalid_argument("read_incumbent: theta must be [" + std::to_string(plan_.n_params) +
                                "] float64 in host memory");
  // The device copy, not the mirror: this is what the candidates were scored around.
  check(cudaMemcpyAsync(theta.data, theta_d_.data(), sz(plan_.n_params) * sizeof(double),
                        cudaMemcpyDeviceToHost, stream_.get()),
        "cudaMemcpyAsync incumbent to host");
  stream_.synchronize();
}

template <class T>
const char* DeviceSession<T>::explain() {
  std::ostringstream j;
  const bool sub = subspace_ != nullptr;
  const bool dense = path_ == PathKind::dense || path_ == PathKind::materialised;
  const char* path = path_ == PathKind::dense          ? "dense"
                     : path_ == PathKind::materialised ? "materialised"
                     : sub                             ? "subspace-delta"
                                                       : "sparse";
  const char* dtype = sizeof(T) == 4 ? "float32" : "float64";
  j << "{\"evaluator\":\"cuda\",\"device\":\"" << device_name() << "\",\"dtype\":\"" << dtype
    << "\",\"candidate_dtype\":\""
    << (autocast_ == PP_DTYPE_BF16  ? "bf16"
        : autocast_ == PP_DTYPE_F16 ? "fp16"
                                    : dtype)
    << "\",\"path\":\"" << path << "\""
    << ",\"forced\":" << (forced_ ? "true" : "false") << ",\"chunk\":" << chunk_cap_
    << ",\"last_candidates\":" << last_count_ << ",\"device_bytes\":" << DeviceMemory::live()
    << ",\"device_peak_bytes\":" << DeviceMemory::peak()
    << ",\"device_transports\":" << device_transports_
    << ",\"step_bytes_to_device\":" << step_bytes_up_
    << ",\"step_bytes_to_host\":" << step_bytes_down_;
  if (sub) j << ",\"subspace_projections\":\"" << describe_projections() << "\"";
  if (site_local_) {
    double site_ms = 0.0, other_ms = 0.0;
    for (int64_t c = 0; c < timed_chunks_; ++c) {
      const double ms = chunk_events_[sz(2 * c + 1)].since(chunk_events_[sz(2 * c)]);
      (chunk_site_[sz(c)] != 0 ? site_ms : other_ms) += ms;
    }
    j << ",\"last_call_candidates_per_path\":{\"site-local\":" << site_candidates_
      << ",\"dense\":" << last_count_ - site_candidates_ << "}"
      << ",\"last_call_gpu_ms_per_path\":{\"site-local\":" << site_ms << ",\"dense\":" << other_ms
      << "}";
  }
  if (autocast_ != 0)
    j << ",\"autocast\":{\"last_candidates\":" << autocast_candidates_
      << ",\"what\":\"the changes of the layers after a candidate's first changed one, one "
         "tensor-core GEMM over the chunk with float32 accumulation; the incumbent, the "
         "first layer's sparse correction, the activations and the loss in float32\","
         "\"declined\":\"the fused tails of sparse changes (a rank-one update costs less than "
         "a GEMM) and particles that straddle two layers run in float32\"}";
  j << ",\"layers\":[";
  for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
    const OpPlan& op = plan_.ops[i];
    if (i > 0) j << ",";
    j << "{\"layer\":" << i << ",\"op\":\"" << op_name(op.op) << "\",\"path\":\"";
    const bool site_kind = op.op == PP_OP_CONV || op.op == PP_OP_SELF_ATTENTION ||
                           op.op == PP_OP_CHERI_BLOCK || op.op == PP_OP_LINEAR;
    if (site_local_ && site_kind)
      j << "site-local for " << site_particles(static_cast<int32_t>(i)) << " of "
        << op_particles(static_cast<int32_t>(i)) << " particles (" << site_what(op.op)
        << (!conv_tail_to_.empty() && conv_tail_to_[i] >= 0
                ? "; the moved channels taken through the channel-local ops straight into "
                  "layer " +
                      std::to_string(conv_tail_to_[i]) +
                      "'s output as a sparse change, the conv's output never written per "
                      "candidate"
                : "")
        << (!carry_to_.empty() && carry_to_[i] >= 0
                ? "; their change carried straight into layer " + std::to_string(carry_to_[i]) +
                      "'s output, rank one per hidden unit, the block's output never written "
                      "per candidate"
                : "")
        << ", batched over the chunk; later ops one kernel or GEMM over the chunk), dense for "
           "the others: one kernel over every (candidate, sample), each candidate with its "
           "own materialised parameters";
    else if (op.op != PP_OP_LINEAR && op.op != PP_OP_ACTIVATION)
      j << path
        << ": one kernel over every (candidate, sample), each candidate with its own "
           "materialised parameters where it changes them";
    else if (op.op == PP_OP_LINEAR && path_ == PathKind::materialised)
      j << path
        << ": every layer recomputed for every candidate from the inputs, the changed "
           "layers with the candidate's materialised weights (cuBLAS strided batched GEMM)";
    else if (op.op == PP_OP_LINEAR && dense)
      j << path
        << ": from the first changed layer's input (prefix reused), the changed layers "
           "with the candidate's materialised weights (cuBLAS strided batched GEMM), later "
           "layers one cuBLAS GEMM over the chunk";
    else if (op.op == PP_OP_LINEAR)
      j << path
        << ": first changed layer = incumbent output + sparse correction over the changed "
           "weights (Q(w+d)-Q(w)) x; later layers one cuBLAS GEMM over the chunk";
    else
      j << "elementwise, exact f(z + dz) on the corrected pre-activations";
    j << "\"";
    if (op.op == PP_OP_SELF_ATTENTION) j << ",\"attention\":\"" << attention_[i] << "\"";
    j << "}";
  }
  j << "],\"declined\":{";
  if (!dense)
    j << "\"dense\":\"a particle changes a few entries of a layer: the delta costs less than "
         "a materialised GEMM per candidate (path dense or materialised forces it)\",";
  if (sub)
    j << "\"sparse\":\"the particles move subspace coordinates\"";
  else
    j << "\"subspace-delta\":\"no subspace\"";
  j << "}}";
  explain_ = j.str();
  return explain_.c_str();
}

// Takes the host's "factored_correction" operation for the GPU and T when `host` (may be
// null) offers one: the dense subspace directions of an op with at least
// kMinSharedDirections of them are then projected by it (one cuBLAS GEMM), not by
// dense_v_kernel.
template <class T>
void DeviceSession<T>::attach_correction(const pp_host_api* host) {
  const int32_t dtype = sizeof(T) == 4 ? PP_DTYPE_F32 : PP_DTYPE_F64;
  const pp_operation* op = nullptr;
  if (host != nullptr && host->find_operation != nullptr)
    op = host->find_operation(host->ctx, PP_OPERATION_FACTORED_CORRECTION, PP_DEVICE_CUDA, dtype);
  if (op == nullptr) return;
  correction_ = static_cast<const pp_factored_correction_table*>(op->table);
  const char* provider =
      host->operation_provider != nullptr ? host->operation_provider(host->ctx, op) : nullptr;
  correction_provider_ = provider != nullptr ? provider : "the host";
}

// For explain: how the dense subspace directions are projected onto each op's input.
template <class T>
std::string DeviceSession<T>::describe_projections() const {
  std::string shared, own;
  int64_t own_count = 0;
  for (std::size_t o = 0; o < vx_rows_.size(); ++o) {
    if (vx_rows_[o].empty()) continue;
    if (o < vx_dirs_d_.size() && vx_dirs_d_[o].size() > 0)
      shared += (shared.empty() ? "" : ", ") + std::to_string(o) + " (" +
                std::to_string(vx_rows_[o].size()) + " directions)";
    else
      own_count += static_cast<int64_t>(vx_rows_[o].size());
  }
  if (shared.empty() && own_count == 0) return "no dense subspace directions in a fused tail";
  if (correction_ == nullptr)
    own = "no factored_correction operation loaded for cuda, " +
          std::string(sizeof(T) == 4 ? "float32" : "float64");
  else if (own_count > 0)
    own = "ops with fewer than " + std::to_string(kMinSharedDirections) + " directions";
  std::string text;
  if (!shared.empty())
    text = "factored_correction from " + correction_provider_ + " (one cuBLAS GEMM) for op" +
           (shared.find(',') != std::string::npos ? "s " : " ") + shared;
  if (own_count > 0)
    text += (text.empty() ? "" : "; ") + std::to_string(own_count) +
            " directions by the plugin's own kernel, a thread per (direction, sample) (" + own +
            ")";
  return text;
}

// Hands every attention op the host's "sdpa" operation for the GPU and T when `host` (may be
// null) offers one, and says in attention_ which attention each op runs, for explain.
template <class T>
void DeviceSession<T>::attach_sdpa(const pp_host_api* host) {
  const int32_t dtype = sizeof(T) == 4 ? PP_DTYPE_F32 : PP_DTYPE_F64;
  const std::string kind = std::string("cuda, ") + (sizeof(T) == 4 ? "float32" : "float64");
  const pp_operation* sdpa = nullptr;
  if (host != nullptr && host->find_operation != nullptr)
    sdpa = host->find_operation(host->ctx, PP_OPERATION_SDPA, PP_DEVICE_CUDA, dtype);
  attention_.assign(plan_.ops.size(), "");
  for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
    if (plan_.ops[i].op != PP_OP_SELF_ATTENTION) continue;
    if (sdpa == nullptr) {
      attention_[i] = "explicit: the plugin's kernel (no sdpa operation loaded for " + kind + ")";
      continue;
    }
    plan_.ops[i].layer.sdpa = static_cast<const pp_sdpa_table*>(sdpa->table);
    const char* provider =
        host->operation_provider != nullptr ? host->operation_provider(host->ctx, sdpa) : nullptr;
    attention_[i] = "sdpa (" + kind + ") from " + (provider != nullptr ? provider : "the host") +
                    ", every (candidate, sample, head) of a chunk batched";
  }
}

template <class T>
const char* DeviceSession<T>::site_what(int32_t op) {
  switch (op) {
    case PP_OP_CONV:
      return "the moved output channels recomputed from the incumbent's input, the others "
             "copied";
    case PP_OP_SELF_ATTENTION:
      return "one head's moved q/k/v rows and mix recomputed, its change through out_proj's "
             "columns of the head, or out_proj's moved entries times the incumbent's mix";
    case PP_OP_LINEAR:
      return "the incumbent's output plus the moved weights' change times the incumbent's "
             "input";
    default:
      return "fc1's moved hidden units: the incumbent's pre-activation plus the moved "
             "entries times its normalised conv, GELU's change there through fc2; or fc2's "
             "moved entries times the incumbent's hidden values; with a carry, conv taps too: "
             "the plane statistics updated by the moved channels' change, fc1's output the "
             "affine map of the incumbent's they make plus those channels' term";
  }
}

template <class T>
void DeviceSession<T>::upload_subspace() {
  // Basis vectors are shared by many coordinates: each distinct one goes up once.
  std::map<const double*, int64_t> where;
  std::vector<double> basis;
  std::vector<DeviceCoord> coords(sz(subspace_->dimension));
  auto place = [&](const double* v, int64_t n) -> int64_t {
    auto [it, fresh] = where.try_emplace(v, static_cast<int64_t>(basis.size()));
    if (fresh) basis.insert(basis.end(), v, v + n);
    return it->second;
  };
  for (int64_t k = 0; k < subspace_->dimension; ++k) {
    const pp_subspace_coord& q = subspace_->coords[k];
    if (q.offset < 0 || q.rows < 0 || q.cols < 0 || q.offset + q.rows * q.cols > plan_.n_params)
      throw std::invalid_argument("subspace coordinate " + std::to_string(k) +
                                  " lies outside the parameters");
    coords[sz(k)] = {q.offset,
                     q.rows,
                     q.cols,
                     q.row,
                     q.col,
                     q.row >= 0 ? -1 : place(q.u, q.rows),
                     q.col >= 0 ? -1 : place(q.v, q.cols)};
  }
  sub_coords_d_.upload(coords.data(), coords.size(), stream_.get());
  sub_coords_h_ = coords;
  basis_d_.upload(basis.data(), basis.size(), stream_.get());
  basis_h_ = std::move(basis);
}

// The members defined here, for both compute types.
template void DeviceSession<float>::set_batch(const pp_batch_view& batch);
template void DeviceSession<double>::set_batch(const pp_batch_view& batch);
template void DeviceSession<float>::set_particles(const pp_particle_layout& layout);
template void DeviceSession<double>::set_particles(const pp_particle_layout& layout);
template void DeviceSession<float>::set_incumbent(const pp_tensor& theta);
template void DeviceSession<double>::set_incumbent(const pp_tensor& theta);
template void DeviceSession<float>::move_incumbent(const double* moves);
template void DeviceSession<double>::move_incumbent(const double* moves);
template void DeviceSession<float>::read_incumbent(pp_tensor& theta);
template void DeviceSession<double>::read_incumbent(pp_tensor& theta);
template const char* DeviceSession<float>::explain();
template const char* DeviceSession<double>::explain();
template void DeviceSession<float>::attach_correction(const pp_host_api* host);
template void DeviceSession<double>::attach_correction(const pp_host_api* host);
template std::string DeviceSession<float>::describe_projections() const;
template std::string DeviceSession<double>::describe_projections() const;
template void DeviceSession<float>::attach_sdpa(const pp_host_api* host);
template void DeviceSession<double>::attach_sdpa(const pp_host_api* host);
template const char* DeviceSession<float>::site_what(int32_t op);
template const char* DeviceSession<double>::site_what(int32_t op);
template void DeviceSession<float>::upload_subspace();
template void DeviceSession<double>::upload_subspace();

std::unique_ptr<Session> make_session(const pp_model_view& model, const pp_loss_view& loss,
                                      const pp_session_options& options) {
  if (options.dtype == PP_DTYPE_F32)
    return std::make_unique<DeviceSession<float>>(model, loss, options);
  return std::make_unique<DeviceSession<double>>(model, loss, options);
}

}  // namespace polyprobe::cuda
