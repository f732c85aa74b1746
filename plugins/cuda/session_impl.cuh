// The CUDA evaluator session, declared once for the files that define it: session.cu (its
// life cycle: construction, batch, particles, incumbent, explain), session_plan.cu (what each
// particle runs: fused tails, site-local carries, chunk runs), session_score.cu (a score call:
// the incumbent's prefix, the chunks, the losses), session_transport.cu (the transport half of
// a step) and one file per evaluation path: path_layered.cu (sparse / subspace delta, with
// autocast), path_dense.cu (the dense and materialised paths) and path_fused.cu (the fused
// tail).
//
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
#pragma once

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

inline std::size_t sz(int64_t n) { return static_cast<std::size_t>(n); }

// Dense subspace directions of one op from which the host's factored_correction operation
// (one cuBLAS GEMM) projects them instead of dense_v_kernel (a thread per direction and
// sample, reading the input with a stride). On the H100 a whole evaluation after a move was
// 1.06x faster with it at 32 directions and 1.10x at 64 (`polyprobe bench factored
// --bench-device cuda`); at 2 only complete steps were timed, 1.09x and 0.99x in two calls
// of a noisy host (docs/benchmarks.md, "factored_correction").
inline constexpr int64_t kMinSharedDirections = 2;

// How a session runs its candidates (pp_session_options::path).
enum class PathKind {
  automatic,     // the fused tail where it applies, else the layered sparse / subspace delta
  layered,       // the layered sparse / subspace-delta path only
  dense,         // materialised weights of the changed ops, batched GEMM, prefix reused
  materialised,  // every op recomputed for every candidate from the inputs (the check path)
};

inline const char* op_name(int32_t op) {
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

inline PathKind parse_path(const char* path) {
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
                const pp_session_options& options);

  void set_batch(const pp_batch_view& batch) override;

  void set_particles(const pp_particle_layout& layout) override;

  void set_incumbent(const pp_tensor& theta) override;

  void move_incumbent(const double* moves) override;

  void score(const pp_score_request& request, double* losses, double* incumbent_loss) override;

  void transport(const pp_transport_request& request) override;

  void read_incumbent(pp_tensor& theta) override;

  const char* explain() override;

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
  void attach_correction(const pp_host_api* host);

  // For explain: how the dense subspace directions are projected onto each op's input.
  std::string describe_projections() const;

  // Hands every attention op the host's "sdpa" operation for the GPU and T when `host` (may be
  // null) offers one, and says in attention_ which attention each op runs, for explain.
  void attach_sdpa(const pp_host_api* host);

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
  static const char* site_what(int32_t op);

  // The Cheri blocks whose output feeds a linear op through identities alone: their
  // site-local candidates carry their change into that op (site_local.cuh, CheriCarry).
  void plan_carries();

  // The conv ops whose output reaches a linear op through channel-local ops alone
  // (site_local.cuh, ConvTail). Not where rounding decides (the 0-1 loss, a sign or staircase
  // after the linear op): the tail adds a change where the dense path recomputes the sum.
  void plan_conv_tails();

  // The most site-buffer values one sample of a chunk needs.
  int64_t site_scratch_max() const;

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
  void plan_runs();

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

  void upload_subspace();

  void incumbent_changed() {
    sum_sq_ = std::inner_product(theta_h_.begin(), theta_h_.end(), theta_h_.begin(), 0.0);
    prefix_dirty_ = true;
  }

  ParticleTable table();

  void linear(std::size_t i, const T* x, int64_t rows, T* y) {
    const OpPlan& op = plan_.ops[i];
    const T* w = eff_d_.data() + op.param_offset;
    gemm<T>(blas_.get(), static_cast<int>(op.out), static_cast<int>(rows), static_cast<int>(op.in),
            w, x, y);
    if (op.bias) launch_add_bias<T>(y, w + op.out * op.in, rows, op.out, stream_.get());
  }

  // The incumbent's effective weights and its activations at every op boundary.
  void refresh_prefix();

  int64_t bytes_per_candidate() const;

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

  int64_t chunk_capacity();

  void release_chunk_buffers();

  ParticleTable start_layered_chunk(const CandidateSource& src, int64_t count);
  void run_chunk(const CandidateSource& src, int64_t count, int32_t first, int32_t last);

  // candidate_autocast (autocast.cuh): the chunk's candidates as changes from the incumbent.
  // Op `first` is the only op they change: its change is the sparse correction alone; each
  // activation maps the change of its input to the change of its output in float32; each
  // later linear op is one reduced-precision GEMM of the change (no bias: it cancels).
  void run_autocast_chunk(const CandidateSource& src, int64_t count, int32_t first);

  // The dense and materialised paths: every op from `start` on runs for each candidate with
  // cuBLAS; the ops the candidates change (first..last) with their own materialised weights
  // (a strided batched GEMM), the others with the incumbent's (one GEMM over the chunk). The
  // dense path starts at the first changed op from the incumbent's input there (prefix
  // reuse); the materialised path starts at the inputs and reuses nothing, so it checks the
  // others.
  // With `site`, every particle of the chunk has a site plan in op `first` (== last), which
  // the site-local kernels run instead of the op's dense form.
  void run_dense_chunk(const CandidateSource& src, int64_t count, int32_t start, int32_t first,
                       int32_t last, bool site);

  // --- The fused tail (fused_tail.cuh): which ops can end a candidate in one kernel.
  struct TailPlan {
    bool ok = false;
    int32_t hidden = -1;  // -1: op l is the output; 0: m1 is; 1: m1 hidden, m2 the output
    int32_t m1 = -1, m2 = -1;
    ActivationChain f1{}, f2{};
  };

  // Appends the activations from op i on to `chain`; returns the first op that is not one.
  std::size_t read_chain(std::size_t i, ActivationChain& chain, bool& ok) const;

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

  void plan_tails();

  // Per particle: its rank-one terms and fused mode, or -1 for the general path.
  void build_fused_terms();

  // The incumbent's activations transposed (one sample per thread reads them coalesced)
  // and the dense v products of each op's input.
  void refresh_fused_inputs();

  void run_fused_chunk(const CandidateSource& src, int64_t count, int32_t l, int32_t mode);

  void incumbent_objective(double* slot);

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

}  // namespace polyprobe::cuda
