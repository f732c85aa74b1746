// The CUDA evaluator session: batch, incumbent, effective weights and the incumbent's
// activations stay on the device; a score call uploads the step's directions, generates
// and scores every candidate on the device and copies the losses back once.
//
// A candidate changes the few raw parameters of one particle. Its first changed linear op
// starts from the incumbent's output there plus a sparse correction (prefix reuse and the
// sparse delta: dz[b, o] = sum (Q(w + d) - Q(w)) x[b, i] over its changed weights), then
// the activations run exactly on the corrected values and every later op runs densely, one
// GEMM over the whole chunk of candidates, corrected again where the particle also touches
// a later op (a particle may straddle two layers). In a subspace the changed parameters are
// the rows and columns of the particle's rank-one coordinates, with the same arithmetic as
// kernels::apply_subspace_move.
//
// With candidate_autocast (autocast.cuh) a float32 session runs the later layers of those
// candidates on their changes, in bf16 or fp16 GEMMs with float32 accumulation.
#include "autocast.cuh"
#include "blas.cuh"
#include "common.cuh"
#include "device.hpp"
#include "fused_tail.cuh"
#include "kernels.cuh"
#include "model_plan.hpp"
#include "session.hpp"
#include "site_local.cuh"
#include "transport.cuh"

#include <polyprobe/plugin/kernels/subspace_move.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace polyprobe::cuda {
namespace {

std::size_t sz(int64_t n) { return static_cast<std::size_t>(n); }

// Dense subspace directions of one op from which the host's factored_correction operation
// (one cuBLAS GEMM) projects them instead of dense_v_kernel (a thread per direction and
// sample, reading the input with a stride). On the H100 a whole evaluation after a move was
// 1.06x faster with it at 32 directions and 1.10x at 64 (`polyprobe bench factored
// --bench-device cuda`); at 2 only complete steps were timed, 1.09x and 0.99x in two calls
// of a noisy host (docs/benchmarks.md, "factored_correction").
constexpr int64_t kMinSharedDirections = 2;

// How a session runs its candidates (pp_session_options::path).
enum class PathKind {
  automatic,     // the fused tail where it applies, else the layered sparse / subspace delta
  layered,       // the layered sparse / subspace-delta path only
  dense,         // materialised weights of the changed ops, batched GEMM, prefix reused
  materialised,  // every op recomputed for every candidate from the inputs (the check path)
};

const char* op_name(int32_t op) {
  switch (op) {
    case PP_OP_LINEAR:
      return "linear";
    case PP_OP_ACTIVATION:
      return "activation";
    case PP_OP_LAYER_NORM:
      return "layer_norm";
    case PP_OP_CONV:
      return "conv";
    case PP_OP_POOL:
      return "pool";
    case PP_OP_SELF_ATTENTION:
      return "self_attention";
    case PP_OP_MOE:
      return "moe";
    case PP_OP_LIF:
      return "lif";
    case PP_OP_CHERI_BLOCK:
      return "cheri_block";
    default:
      return "?";
  }
}

PathKind parse_path(const char* path) {
  const std::string_view p = path == nullptr ? "auto" : path;
  if (p == "layered") return PathKind::layered;
  if (p == "dense") return PathKind::dense;
  if (p == "materialised") return PathKind::materialised;
  return PathKind::automatic;  // auto, sparse, subspace-delta: validated by the plugin
}

template <class T>
class DeviceSession final : public Session {
 public:
  DeviceSession(const pp_model_view& model, const pp_loss_view& loss,
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
    if (plan_.layered_kinds && path_ != PathKind::materialised) path_ = PathKind::dense;
    forced_dense_ = path_ != PathKind::automatic;
    // The site-local path serves the particles of conv, attention and Cheri ops that it can
    // (site_local.cuh) unless a path was forced; the rest of such a model runs densely.
    site_local_ = plan_.layered_kinds && !forced_ && subspace_ == nullptr;
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
        ops[i] = {op.param_offset, op.param_count, PP_TRANSFORM_IDENTITY, PP_TRANSFORM_IDENTITY,
                  1.0};
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

  void set_batch(const pp_batch_view& batch) override {
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
      targets_d_.upload(static_cast<const double*>(batch.targets.data),
                        sz(rows * plan_.out_features), stream_.get());
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

  void set_particles(const pp_particle_layout& layout) override {
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

  void set_incumbent(const pp_tensor& theta) override {
    use_device();
    if (theta.dtype != PP_DTYPE_F64 || theta.device != PP_DEVICE_CPU ||
        pp_numel(theta) != plan_.n_params)
      throw std::invalid_argument("set_incumbent: theta must be [" +
                                  std::to_string(plan_.n_params) + "] float64 in host memory");
    const auto* data = static_cast<const double*>(theta.data);
    theta_h_.assign(data, data + plan_.n_params);
    theta_d_.upload(theta_h_.data(), theta_h_.size(), stream_.get());
    incumbent_changed();
  }

  void move_incumbent(const double* moves) override {
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

  void score(const pp_score_request& request, double* losses, double* incumbent_loss) override {
    use_device();
    if (batch_ == 0) throw std::logic_error("score before set_batch");
    if (theta_h_.empty() && plan_.n_params > 0)
      throw std::logic_error("score before set_incumbent");
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
      if (rotations != nullptr) {
        // Per particle [P d d] up, the [P V d] directions built here.
        rot_d_.upload(rotations, sz(particles_ * d_ * d_), s);
        step_bytes_up_ += sz(particles_ * d_ * d_) * sizeof(double);
        dir_d_.reserve(sz(particles_ * vertices_ * d_));
        launch_directions(rot_d_.data(), polytope_d_.data(), particles_, vertices_, d_,
                          dir_d_.data(), s);
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

  void transport(const pp_transport_request& request) override {
    use_device();
    if (!losses_resident_)
      throw std::logic_error(
          "transport: no step's losses on the device (score a polytope set with losses == NULL "
          "first)");
    losses_resident_ = false;
    const int64_t P = particles_, V = vertices_, B = request.n_blocks;
    if (B < 1) throw std::invalid_argument("transport: no blocks");
    int64_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      if (request.block_first[b] != next || request.block_count[b] < 1)
        throw std::invalid_argument("transport: block " + std::to_string(b) +
                                    " does not continue the tiling of the particles");
      next += request.block_count[b];
    }
    if (next != P)
      throw std::invalid_argument("transport: the blocks cover " + std::to_string(next) + " of " +
                                  std::to_string(P) + " particles");
    const bool sinkhorn = request.solver == PP_SOLVER_SINKHORN;
    if (request.solver != PP_SOLVER_SINKHORN && request.solver != PP_SOLVER_SOFTMAX &&
        request.solver != PP_SOLVER_TOP_K)
      throw std::invalid_argument("transport: unknown solver " + std::to_string(request.solver));
    if (request.solver == PP_SOLVER_TOP_K && (request.top_k < 1 || request.top_k > V))
      throw std::invalid_argument("transport: top_k = " + std::to_string(request.top_k) +
                                  " must be in [1, " + std::to_string(V) + "]");
    if (sinkhorn && (request.duals_f == nullptr || request.duals_g == nullptr ||
                     request.duals_fresh == nullptr))
      throw std::invalid_argument("transport: sinkhorn needs the duals");
    if (request.incumbents != nullptr && request.n_incumbents != 1 && request.n_incumbents != P)
      throw std::invalid_argument("transport: f(X) must be one value or one per particle");
    cudaStream_t s = stream_.get();
    block_first_d_.upload(request.block_first, sz(B), s);
    block_count_d_.upload(request.block_count, sz(B), s);
    if (sinkhorn) {
      duals_f_d_.upload(request.duals_f, sz(P), s);
      duals_g_d_.upload(request.duals_g, sz(B * V), s);
      duals_fresh_d_.upload(request.duals_fresh, sz(B), s);
    }
    if (request.incumbents != nullptr)
      incumbents_d_.upload(request.incumbents, sz(request.n_incumbents), s);
    cost_d_.reserve(sz(P * V));
    weights_d_.reserve(sz(P * V));
    step_moves_d_.reserve(sz(P * d_));
    blocks_d_.reserve(sz(B));
    TransportProblem t;
    t.particles = P;
    t.vertices = vertices_;
    t.probes = probes_;
    t.d = d_;
    t.losses = losses_d_.data();
    t.directions = dir_d_.data();
    t.solver = request.solver;
    t.top_k = request.top_k;
    t.sinkhorn_max_iterations = request.sinkhorn_max_iterations;
    t.sinkhorn_tolerance = request.sinkhorn_tolerance;
    t.temperature = request.temperature;
    t.cost_scaling = request.cost_scaling;
    t.nonfinite_margin = request.nonfinite_margin;
    t.n_blocks = B;
    t.block_first = block_first_d_.data();
    t.block_count = block_count_d_.data();
    t.step_radius = request.step_radius;
    if (sinkhorn) {
      t.duals_f = duals_f_d_.data();
      t.duals_g = duals_g_d_.data();
      t.duals_fresh = duals_fresh_d_.data();
    }
    if (request.incumbents != nullptr) {
      t.incumbents = incumbents_d_.data();
      t.n_incumbents = request.n_incumbents;
      t.scaled_radius = request.scaled_radius;
    }
    t.cost = cost_d_.data();
    t.weights = weights_d_.data();
    t.moves = step_moves_d_.data();
    t.blocks = blocks_d_.data();
    t.host_block_count = request.block_count;
    grid_partials_d_.reserve(transport_grid_scratch());
    t.grid_partials = grid_partials_d_.data();
    launch_transport(t, s);
    const auto down = [&](void* host, const void* device, std::size_t bytes, const char* what) {
      check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s), what);
      step_bytes_down_ += bytes;
    };
    step_bytes_up_ +=
        sz(2 * B) * sizeof(int64_t) +
        (request.incumbents != nullptr ? sz(request.n_incumbents) * sizeof(double) : 0) +
        (sinkhorn ? sz(P + B * V) * sizeof(double) + sz(B) : 0);
    ++device_transports_;
    down(request.moves, step_moves_d_.data(), sz(P * d_) * sizeof(double), "moves to host");
    down(request.blocks, blocks_d_.data(), sz(B) * sizeof(pp_transport_block), "blocks to host");
    if (sinkhorn) {
      down(request.duals_f, duals_f_d_.data(), sz(P) * sizeof(double), "duals to host");
      down(request.duals_g, duals_g_d_.data(), sz(B * V) * sizeof(double), "duals to host");
    }
    if (request.weights != nullptr)
      down(request.weights, weights_d_.data(), sz(P * V) * sizeof(double), "weights to host");
    stream_.synchronize();
  }

  void read_incumbent(pp_tensor& theta) override {
    use_device();
    if (theta.dtype != PP_DTYPE_F64 || theta.device != PP_DEVICE_CPU ||
        pp_numel(theta) != plan_.n_params)
      throw std::invalid_argument("read_incumbent: theta must be [" +
                                  std::to_string(plan_.n_params) + "] float64 in host memory");
    // The device copy, not the mirror: this is what the candidates were scored around.
    check(cudaMemcpyAsync(theta.data, theta_d_.data(), sz(plan_.n_params) * sizeof(double),
                          cudaMemcpyDeviceToHost, stream_.get()),
          "cudaMemcpyAsync incumbent to host");
    stream_.synchronize();
  }

  const char* explain() override {
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

 private:
  static int64_t pp_numel(const pp_tensor& t) {
    int64_t n = 1;
    for (int32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
    return n;
  }
  static int select_device(int32_t index) {
    check(cudaSetDevice(index), "cudaSetDevice");
    return index;
  }
  void use_device() const { check(cudaSetDevice(device_), "cudaSetDevice"); }

  // Takes the host's "factored_correction" operation for the GPU and T when `host` (may be
  // null) offers one: the dense subspace directions of an op with at least
  // kMinSharedDirections of them are then projected by it (one cuBLAS GEMM), not by
  // dense_v_kernel.
  void attach_correction(const pp_host_api* host) {
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
  std::string describe_projections() const {
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
  void attach_sdpa(const pp_host_api* host) {
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

  // Runs a layer_ops.cuh op; an sdpa operation that declines op i's arguments is noted in
  // attention_[i] (the plugin's kernel then runs, now and later).
  void layer_op(std::size_t i, const LayerIo<T>& io, cudaStream_t s) {
    std::string declined;
    launch_layer_op<T>(plan_.ops[i].layer, io, blas_.get(), s, &declined);
    if (!declined.empty()) note_declined(i, declined);
  }

  // The sdpa operation declined op i's arguments: the plugin's kernel runs from now on.
  void note_declined(std::size_t i, const std::string& why) {
    plan_.ops[i].layer.sdpa = nullptr;
    attention_[i] =
        "explicit: the plugin's kernel (the sdpa operation declined: " + json_safe(why) + ")";
  }

  // The particles whose first changed op is op i, and those of them on the site-local path.
  int64_t op_particles(int32_t i) const {
    return std::count(first_op_.begin(), first_op_.end(), i);
  }
  int64_t site_particles(int32_t i) const {
    int64_t n = 0;
    for (std::size_t p = 0; p < site_kind_h_.size(); ++p)
      n += first_op_[p] == i && site_kind_h_[p] != kSiteNone ? 1 : 0;
    return n;
  }
  static const char* site_what(int32_t op) {
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

  // The Cheri blocks whose output feeds a linear op through identities alone: their
  // site-local candidates carry their change into that op (site_local.cuh, CheriCarry).
  void plan_carries() {
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
  void plan_conv_tails() {
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
        steps_after = steps_after ||
                      (plan_.ops[k].op == PP_OP_ACTIVATION &&
                       (plan_.ops[k].fn == PP_ACT_SIGN || plan_.ops[k].fn == PP_ACT_STAIRCASE));
      if (steps_after) continue;
      tail.per_channel = per_channel;
      tail.outputs = next.out;
      conv_tails_[i] = tail;
      conv_tail_to_[i] = static_cast<int32_t>(j);
    }
  }

  // The most site-buffer values one sample of a chunk needs.
  int64_t site_scratch_max() const {
    int64_t widest = 0;
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      widest = std::max(widest, site_scratch_per_sample(plan_.ops[i].layer));
      if (!conv_tails_.empty())
        widest = std::max(widest, conv_tail_scratch_per_sample(conv_tails_[i]));
    }
    return widest;
  }

  // Whether particle p's candidates run on the site-local path.
  bool site_local(int64_t p) const {
    return !site_kind_h_.empty() && site_kind_h_[sz(p)] != kSiteNone;
  }

  // What decides whether two particles' candidates may share a chunk of score(): the first
  // op they change, their fused-tail mode, the site-local choice and, with autocast, whether
  // they also change a later op (those run apart, in float32).
  std::array<int32_t, 4> chunk_key(int64_t p) const {
    return {first_op_[sz(p)], fused_mode_.empty() ? -1 : fused_mode_[sz(p)], site_local(p) ? 1 : 0,
            autocast_ != 0 && last_op_[sz(p)] > first_op_[sz(p)] ? 1 : 0};
  }

  // run_end_[p]: one past the last particle of the run of equal chunk keys that holds p;
  // run_last_[p]: the last op any particle of [p, run_end_[p]) changes.
  void plan_runs() {
    run_end_.assign(sz(particles_), particles_);
    run_last_.assign(sz(particles_), -1);
    for (int64_t p = particles_ - 1; p >= 0; --p) {
      const bool joined = p + 1 < particles_ && chunk_key(p + 1) == chunk_key(p);
      run_end_[sz(p)] = joined ? run_end_[sz(p + 1)] : p + 1;
      run_last_[sz(p)] = std::max(last_op_[sz(p)], joined ? run_last_[sz(p + 1)] : -1);
    }
  }

  // `text` with the characters a JSON string cannot hold raw replaced.
  static std::string json_safe(const std::string& text) {
    std::string out;
    for (const char c : text) out += c == '"' || c == '\\' ? '\'' : (c < 0x20 && c >= 0 ? ' ' : c);
    return out;
  }
  std::string device_name() const {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess)
      return "cuda:" + std::to_string(device_);
    return std::string(prop.name) + " (cuda:" + std::to_string(device_) + ")";
  }
  int32_t first_linear() const {
    for (std::size_t i = 0; i < plan_.ops.size(); ++i)
      if (plan_.ops[i].op == PP_OP_LINEAR) return static_cast<int32_t>(i);
    return -1;
  }

  void upload_subspace() {
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

  void incumbent_changed() {
    sum_sq_ = std::inner_product(theta_h_.begin(), theta_h_.end(), theta_h_.begin(), 0.0);
    prefix_dirty_ = true;
  }

  ParticleTable table() {
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

  void linear(std::size_t i, const T* x, int64_t rows, T* y) {
    const OpPlan& op = plan_.ops[i];
    const T* w = eff_d_.data() + op.param_offset;
    gemm<T>(blas_.get(), static_cast<int>(op.out), static_cast<int>(rows), static_cast<int>(op.in),
            w, x, y);
    if (op.bias) launch_add_bias<T>(y, w + op.out * op.in, rows, op.out, stream_.get());
  }

  // The incumbent's effective weights and its activations at every op boundary.
  void refresh_prefix() {
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

  int64_t bytes_per_candidate() const {
    int64_t bytes = batch_ * (2 * plan_.max_width + 1) * int64_t{sizeof(T)} +
                    elem_max_ * int64_t{sizeof(T) + sizeof(double)} + int64_t{sizeof(double)};
    if (path_ == PathKind::dense || path_ == PathKind::materialised)
      bytes += (largest_block() + elem_max_ + batch_ * largest_scratch()) * int64_t{sizeof(T)};
    if (autocast_ != 0) bytes += batch_ * plan_.max_width * int64_t{kReducedBytes};
    if (site_local_) bytes += batch_ * site_scratch_max() * int64_t{sizeof(T)};
    return bytes;
  }

  int64_t largest_scratch() const {
    int64_t widest = 0;
    for (const OpPlan& op : plan_.ops) widest = std::max(widest, scratch_per_sample(op.layer));
    return widest;
  }

  // The largest parameter block (weights and bias) of one linear op.
  int64_t largest_block() const {
    int64_t widest = 0;
    for (const OpPlan& op : plan_.ops) widest = std::max(widest, block_of(op));
    return widest;
  }
  static int64_t block_of(const OpPlan& op) { return op.param_count; }

  int64_t chunk_capacity() {
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

  void release_chunk_buffers() {
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

  void run_chunk(const CandidateSource& src, int64_t count, int32_t first, int32_t last) {
    cudaStream_t s = stream_.get();
    const int64_t rows = count * batch_;
    buf_a_.reserve(sz(rows * plan_.max_width));
    buf_b_.reserve(sz(rows * plan_.max_width));
    per_.reserve(sz(rows));
    dq_.reserve(sz(count * elem_max_));
    l2_terms_.reserve(sz(count * elem_max_));
    l2c_.reserve(sz(count));
    const ParticleTable t = table();
    launch_deltas<T>(src, t, count, theta_d_.data(), ops_d_.data(), eff_d_.data(), dq_.data(),
                     nullptr, l2_terms_.data(), l2c_.data(), s);
    T* cur = buf_a_.data();
    T* other = buf_b_.data();
    const OpPlan& f = plan_.ops[sz(first)];
    // Prefix reuse: the first changed op starts from the incumbent's own output and input.
    launch_broadcast<T>(acts_[sz(first) + 1].data(), batch_, f.out, count, cur, s);
    launch_correct<T>(src, t, count, first, dq_.data(), acts_[sz(first)].data(), 0, f.in, cur,
                      f.out, batch_, s);
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
  void run_autocast_chunk(const CandidateSource& src, int64_t count, int32_t first) {
    if constexpr (!std::is_same_v<T, float>) {
      throw std::logic_error("candidate_autocast in a float64 session");
    } else {
      cudaStream_t s = stream_.get();
      const int64_t rows = count * batch_;
      buf_a_.reserve(sz(rows * plan_.max_width));
      buf_b_.reserve(sz(rows * plan_.max_width));
      x_reduced_.reserve(sz(rows * plan_.max_width));
      per_.reserve(sz(rows));
      dq_.reserve(sz(count * elem_max_));
      l2_terms_.reserve(sz(count * elem_max_));
      l2c_.reserve(sz(count));
      const ParticleTable t = table();
      launch_deltas<T>(src, t, count, theta_d_.data(), ops_d_.data(), eff_d_.data(), dq_.data(),
                       nullptr, l2_terms_.data(), l2c_.data(), s);
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
          launch_activation_change(cur, acts_[i].data(), acts_[i + 1].data(), batch_ * op.out,
                                   count, op.fn, op.step, cur,
                                   reduced_ready ? x_reduced_.data() : nullptr, autocast_, s);
          continue;
        }
        if (!reduced_ready) launch_to_reduced(cur, x_reduced_.data(), rows * op.in, autocast_, s);
        gemm_reduced(blas_.get(), static_cast<int>(op.out), static_cast<int>(rows),
                     static_cast<int>(op.in), w_reduced_.data() + op.param_offset,
                     x_reduced_.data(), autocast_, other);
        reduced_ready = false;
        std::swap(cur, other);
      }
      launch_add_incumbent(cur, acts_.back().data(), batch_ * plan_.out_features, count, s);
      launch_sample_losses<T>(cur, rows, plan_.out_features, batch_,
                              static_cast<int32_t>(plan_.loss), labels_d_.data(), targets_d_.data(),
                              per_.data(), s);
      launch_objective<T>(src, count, per_.data(), batch_, plan_.l2, sum_sq_, l2c_.data(),
                          losses_d_.data(), s);
      autocast_candidates_ += count;
    }
  }

  // The dense and materialised paths: every op from `start` on runs for each candidate with
  // cuBLAS; the ops the candidates change (first..last) with their own materialised weights
  // (a strided batched GEMM), the others with the incumbent's (one GEMM over the chunk). The
  // dense path starts at the first changed op from the incumbent's input there (prefix
  // reuse); the materialised path starts at the inputs and reuses nothing, so it checks the
  // others.
  // With `site`, every particle of the chunk has a site plan in op `first` (== last), which
  // the site-local kernels run instead of the op's dense form.
  void run_dense_chunk(const CandidateSource& src, int64_t count, int32_t start, int32_t first,
                       int32_t last, bool site) {
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
        launch_site_op<T>(op.layer, src, t, sites, count, batch_, acts_[i].data(),
                          acts_[i + 1].data(),
                          inc_scratch_.empty() ? nullptr : inc_scratch_[i].data(),
                          cheri_views_.empty() ? nullptr : cheri_views_[i].data(),
                          eff_d_.data() + op.param_offset, op.param_offset, q_new_.data(),
                          site_buf_.data(), other, s, &declined);
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
        launch_materialise<T>(src, t, count, static_cast<int32_t>(i), params, op.param_offset,
                              block, q_new_.data(), w_cand_.data(), s);
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

  // --- The fused tail (fused_tail.cuh): which ops can end a candidate in one kernel.
  struct TailPlan {
    bool ok = false;
    int32_t hidden = -1;  // -1: op l is the output; 0: m1 is; 1: m1 hidden, m2 the output
    int32_t m1 = -1, m2 = -1;
    ActivationChain f1{}, f2{};
  };

  // Appends the activations from op i on to `chain`; returns the first op that is not one.
  std::size_t read_chain(std::size_t i, ActivationChain& chain, bool& ok) const {
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

  // The fused tail adds changes to the incumbent's values where the layered path recomputes
  // a layer's output: the same up to rounding, except where rounding decides, at a step of a
  // discontinuous activation after the sum (sign, staircase in f2) or at a tie of the 0-1
  // loss (an exact structural tie, such as all-zero logits, comes out as residue). Those
  // tails take the layered path.
  static bool discontinuous(const ActivationChain& f) {
    for (int32_t i = 0; i < f.n; ++i)
      if (f.fn[i] == PP_ACT_SIGN || f.fn[i] == PP_ACT_STAIRCASE) return true;
    return false;
  }

  void plan_tails() {
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
  void build_fused_terms() {
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
      ok = ok && tail != nullptr && !mine.empty() && mine.size() <= sz(kFusedMaxTerms) &&
           (!is_dense || tail->hidden < 1 || plan_.ops[sz(op)].out <= kFusedMaxDense);
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
        fused_mode_[sz(p)] = tail->hidden < 1        ? (is_dense && staged ? 3 : 0)
                             : is_dense              ? 2
                             : units <= kHiddenUnits ? 4
                                                     : 1;
        dense[sz(p)] = is_dense ? 1 : 0;
      }
      begin.push_back(static_cast<int64_t>(terms.size()));
    }
    if (forced_dense_) std::fill(fused_mode_.begin(), fused_mode_.end(), -1);
    // A hidden tail of dense changes (mode 2: a subspace's dense directions) streams the
    // whole hidden layer per candidate in float32: with autocast that layer runs as a
    // reduced-precision GEMM over the chunk instead. Sparse changes (mode 1: a few units)
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

  // The incumbent's activations transposed (one sample per thread reads them coalesced)
  // and the dense v products of each op's input.
  void refresh_fused_inputs() {
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
        launch_transpose<T>(eff_d_.data() + op.param_offset, op.out, op.in,
                            weights_t_[sz(m)].data(), s);
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

  void run_fused_chunk(const CandidateSource& src, int64_t count, int32_t l, int32_t mode) {
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
    launch_fused_tail<T>(src, t, count, mode, per_.data(), s);
    const double* l2_delta = nullptr;
    if (plan_.l2 != 0.0) {
      // The raw parameters' l2 change, as the general path computes it.
      dq_.reserve(sz(count * elem_max_));
      l2_terms_.reserve(sz(count * elem_max_));
      l2c_.reserve(sz(count));
      launch_deltas<T>(src, table(), count, theta_d_.data(), ops_d_.data(), eff_d_.data(),
                       dq_.data(), nullptr, l2_terms_.data(), l2c_.data(), s);
      l2_delta = l2c_.data();
    }
    launch_objective<T>(src, count, per_.data(), batch_, plan_.l2, sum_sq_, l2_delta,
                        losses_d_.data(), s);
    ++fused_chunks_;
  }

  void incumbent_objective(double* slot) {
    per_.reserve(sz(batch_));
    CandidateSource one{};
    launch_sample_losses<T>(acts_.back().data(), batch_, plan_.out_features, batch_,
                            static_cast<int32_t>(plan_.loss), labels_d_.data(), targets_d_.data(),
                            per_.data(), stream_.get());
    launch_objective<T>(one, 1, per_.data(), batch_, plan_.l2, sum_sq_, nullptr, slot,
                        stream_.get());
  }

  ModelPlan plan_;
  const pp_subspace_view* subspace_;
  int device_;
  Stream stream_;
  Blas blas_;
  int64_t chunk_option_;
  bool forced_ = false;

  DeviceBuffer<OpTransform> ops_d_;
  DeviceBuffer<int32_t> owner_d_;
  DeviceBuffer<DeviceCoord> sub_coords_d_;
  DeviceBuffer<double> basis_d_;

  int64_t batch_ = 0;
  DeviceBuffer<int64_t> labels_d_;
  DeviceBuffer<double> targets_d_;
  std::vector<DeviceBuffer<T>> acts_;  // acts_[0] = inputs, acts_[i + 1] = output of op i

  bool has_particles_ = false, unique_coords_ = true;
  int32_t d_ = 1, vertices_ = 0, probes_ = 1;
  int64_t particles_ = 0, elem_max_ = 1;
  std::vector<int64_t> coords_h_;
  std::vector<int32_t> first_op_, last_op_;
  DeviceBuffer<int64_t> coords_d_, elem_begin_d_, elem_raw_d_;
  DeviceBuffer<int32_t> elem_op_d_, elem_row_d_, elem_col_d_;

  std::vector<double> theta_h_;  // the host mirror, moved with the host's arithmetic
  DeviceBuffer<double> theta_d_;
  DeviceBuffer<T> eff_d_;
  double sum_sq_ = 0.0;
  bool prefix_dirty_ = true;

  DeviceBuffer<int64_t> active_d_, particle_d_;
  DeviceBuffer<double> dir_d_, disp_d_, moves_d_, losses_d_;
  // The transport half of a step (transport.cuh): the bound polytope, the step's rotations,
  // and the solve's inputs, scratch and outputs.
  DeviceBuffer<double> polytope_d_, rot_d_, cost_d_, weights_d_, step_moves_d_;
  DeviceBuffer<double> duals_f_d_, duals_g_d_, incumbents_d_, grid_partials_d_;
  DeviceBuffer<int64_t> block_first_d_, block_count_d_;
  DeviceBuffer<uint8_t> duals_fresh_d_;
  DeviceBuffer<pp_transport_block> blocks_d_;
  bool losses_resident_ = false;  // the last score kept its losses here for transport()
  bool active_is_all_ = false;    // active_d_ holds 0..P-1 (reset by set_particles)
  // What the last step moved over PCIe (polytope score, transport, move), for explain and the
  // tests that check no per-candidate data crosses; and the transports solved here.
  std::size_t step_bytes_up_ = 0, step_bytes_down_ = 0;
  int64_t device_transports_ = 0;
  std::vector<double> staging_;
  DeviceBuffer<T> buf_a_, buf_b_, per_, dq_;
  DeviceBuffer<T> q_new_, w_cand_;  // the dense paths: new values, materialised op blocks
  DeviceBuffer<T> scratch_;         // layer_ops.cuh scratch (attention rows)
  // The site-local path: per particle its plan (site_local.cuh), the incumbent's scratch of
  // each layer_ops.cuh op, and a chunk's site buffer.
  bool site_local_ = false;
  std::vector<int32_t> site_kind_h_;
  int64_t site_candidates_ = 0;  // of the last score call
  // GPU time of each chunk of the last score call (a start and an end event per chunk), and
  // whether it ran site-local: read by explain, after the call's synchronisation.
  std::vector<Event> chunk_events_;
  std::vector<uint8_t> chunk_site_;
  int64_t timed_chunks_ = 0;
  DeviceBuffer<int32_t> site_kind_d_, site_n_d_, site_sites_d_;
  std::vector<DeviceBuffer<T>> inc_scratch_;
  DeviceBuffer<T> site_buf_;
  std::vector<CheriCarry<T>> carries_;  // per op: outputs == 0 where none
  std::vector<int32_t> carry_to_;       // per op: the linear op a Cheri block carries into
  std::vector<DeviceBuffer<T>> carry_u_;
  std::vector<DeviceBuffer<T>> cheri_views_;  // per Cheri op: launch_cheri_views
  std::vector<ConvTail> conv_tails_;          // per op: outputs == 0 where none
  std::vector<int32_t> conv_tail_to_;         // per op: the linear op a conv's tail reaches
  PathKind path_ = PathKind::automatic;
  DeviceBuffer<double> l2_terms_, l2c_;
  int64_t chunk_cap_ = 0, last_count_ = 0;
  std::string explain_;
  std::vector<std::string> attention_;  // per op: which attention a self_attention op runs

  // The fused tail.
  std::vector<TailPlan> tails_;   // per op
  std::vector<int64_t> run_end_;  // per particle: plan_runs()
  std::vector<int32_t> run_last_;
  std::vector<int32_t> fused_mode_;            // per particle: -1 general path, else the mode
  std::vector<DeviceCoord> sub_coords_h_;      // the subspace's coordinates as uploaded
  std::vector<std::vector<int64_t>> vx_rows_;  // per op: basis offsets of its dense v
  std::vector<DeviceBuffer<T>> vx_dirs_d_;     // per op: those v as [n_v, in] in T, when the
                                               // factored_correction operation projects them
  std::vector<double> basis_h_;                // the host copy of basis_d_
  const pp_factored_correction_table* correction_ = nullptr;  // the host's, or null
  std::string correction_provider_;
  DeviceBuffer<int64_t> term_begin_d_;
  DeviceBuffer<FusedTerm> terms_d_;
  DeviceBuffer<uint8_t> dense_d_;
  std::vector<DeviceBuffer<int64_t>> vx_offsets_d_;
  std::vector<DeviceBuffer<T>> vx_t_, acts_t_, weights_t_;
  bool forced_dense_ = false;  // path "layered": the general path only
  int64_t fused_chunks_ = 0;

  // candidate_autocast: the reduced dtype (0 = off, always 0 for float64), the effective
  // weights and a chunk's input changes in it, and the candidates the last call ran so.
  int32_t autocast_ = std::is_same_v<T, float> ? plan_.autocast : 0;
  DeviceBuffer<uint16_t> w_reduced_, x_reduced_;
  int64_t autocast_candidates_ = 0;
};

}  // namespace

std::unique_ptr<Session> make_session(const pp_model_view& model, const pp_loss_view& loss,
                                      const pp_session_options& options) {
  if (options.dtype == PP_DTYPE_F32)
    return std::make_unique<DeviceSession<float>>(model, loss, options);
  return std::make_unique<DeviceSession<double>>(model, loss, options);
}

}  // namespace polyprobe::cuda
