// Internals of the cpu_tbb evaluator, shared by its path files (evaluator.cpp: set-up,
// grouping, chunking and threads; delta_path.cpp: sparse and subspace deltas;
// materialised_paths.cpp: dense, in-place and fallback; site_local_path.cpp: conv and
// attention layers per site; loss_kernels.cpp: losses).
#pragma once

#include "evaluator.hpp"
#include "model_plan.hpp"
#include "site_local.hpp"

#include <polyprobe/plugin/kernels/losses.hpp>

#include <tbb/enumerable_thread_specific.h>
#include <tbb/task_arena.h>
#include <Eigen/Core>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace polyprobe::cpu_tbb {

template <class S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using Arr = Eigen::Array<S, 1, Eigen::Dynamic>;  // one value per sample

// A register's worth of samples (one AVX-512 vector): the hot loops run over the batch in
// fixed-size packets, which Eigen compiles to straight-line vector code.
template <class S>
inline constexpr int kLanes = static_cast<int>(64 / sizeof(S));
template <class S>
using Packet = Eigen::Array<S, kLanes<S>, 1>;
template <class S>
using PacketMap = Eigen::Map<Packet<S>, Eigen::Unaligned>;
template <class S>
using ConstPacketMap = Eigen::Map<const Packet<S>, Eigen::Unaligned>;

// Bit i set where lane i of p is >= threshold (false for NaN). Eigen's boolean arrays
// compile to scalar code; this is one vector compare where the instruction set has it.
template <class S>
inline uint32_t lanes_at_least(const Packet<S>& p, S threshold) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<S, float>)
    return _mm512_cmp_ps_mask(_mm512_loadu_ps(p.data()), _mm512_set1_ps(threshold), _CMP_GE_OQ);
  else
    return _mm512_cmp_pd_mask(_mm512_loadu_pd(p.data()), _mm512_set1_pd(threshold), _CMP_GE_OQ);
#else
  uint32_t mask = 0;
  for (int i = 0; i < kLanes<S>; ++i)
    if (p(i) >= threshold) mask |= uint32_t{1} << i;
  return mask;
#endif
}

enum class Path : int { delta, dense, inplace, fallback, incumbent, site_local, count };
inline constexpr int kPathCount = static_cast<int>(Path::count);
// "sparse" or "subspace-delta" for the delta path, by search space.
const char* path_name(Path path, bool subspace);

// Why a group did not take the delta path.
enum class Decline : int {
  none,
  no_prefix_reuse,     // a layer is not prefix-reusable (model-wide)
  not_affine,          // a moved coordinate belongs to a layer not verified affine
  subspace_transform,  // a subspace coordinate moves a transformed weight (not rank one)
  across_host,         // the particle changes layers on both sides of a host layer
  forced,              // another path was requested
  // why a group whose particle lies in a site-local layer did not take the site-local path
  site_not_declared,  // a layer of the particle does not declare the site-local contract
  site_subspace,      // subspace coordinates (the path serves the full space)
  site_spans_layers,  // the particle's coordinates lie in more than one layer
  site_unknown_kind,  // the plugin has no per-site computation for the kind (or attributes)
  site_probe_failed,  // the per-site computation disagreed with the layer's forward
  site_forced,        // another path was requested
  count
};
const char* decline_text(Decline why);

// One coordinate of a particle as a rank-one change of an affine layer's pre-activation:
// dz = theta * u (v^T x), u = e_row or a dense vector, v = e_col, a dense vector or the
// bias input 1.
inline constexpr int64_t kDenseV = -1, kBias = -2;
struct Term {
  int32_t layer = 0;
  int32_t slot = 0;      // the particle's displacement component that drives it
  int64_t row = 0;       // >= 0: one output unit; -1: dense u (u_index)
  int64_t col = 0;       // >= 0: one input feature; kDenseV: dense v (v_index); kBias
  int32_t u_index = -1;  // into dense_u_
  int32_t v_index = -1;  // into dense_v_
  int64_t param = -1;    // full space: the parameter moved (its transform gives theta)
};

// A block of adjacent candidates that move one particle, and the path it takes.
struct Group {
  int64_t begin = 0, end = 0;
  int64_t particle = 0;
  Path path = Path::fallback;
  Decline why = Decline::none;
  int32_t first_layer = 0;                 // the first layer the particle changes
  int64_t terms_begin = 0, terms_end = 0;  // into terms_
  Decline site_why = Decline::none;        // why the site-local path declined (if it did)
};

template <class S>
class EvaluatorImpl final : public CandidateEvaluator {
 public:
  EvaluatorImpl(const pp_model_view& model, const pp_loss_view& loss,
                const pp_session_options& options);
  void register_batch(const pp_batch_view& batch) override;
  void evaluate(const Candidates& c, double* losses, double* incumbent_loss,
                uint64_t incumbent_version) override;
  const char* explain() override;

 private:
  // Everything one worker needs for one group; sized on first use, then reused, so the
  // hot path allocates nothing per candidate.
  struct Scratch {
    // delta path: deltas are feature-major, [features, candidates * batch]
    Mat<S> delta, next, dense_in, room;
    Mat<S> sparse;  // [units, candidates * batch]
    std::vector<int64_t> units;
    std::vector<S> theta;  // [candidates * terms]
    Arr<S> src, tmp_b, max_b, sum_b;
    Eigen::Matrix<S, Eigen::Dynamic, 1> column, tmp_col;
    Mat<S> by_direction;  // [distinct dense u, candidates * batch]
    Mat<S> step;          // [candidates, batch]: the scalar move along one direction
    std::vector<int32_t> directions;
    std::vector<S> buffer, buffer_out;  // host elementwise on padded flat buffers
    // materialised paths: sample-major
    std::vector<S> eff;         // effective parameters (transforms applied)
    std::vector<S> raw_params;  // fallback: parameters as the host layers take them
    uint64_t generation = 0, raw_generation = 0;
    std::vector<double> row_losses;
    std::vector<Mat<S>> hidden;
    Mat<S> stack, stack_next;
    std::vector<int64_t> touched;  // parameters a group changes
    std::vector<double> coef;      // [touched * d]: d(param) / d(displacement component)
    std::vector<double> raw;       // [touched] per candidate
    std::vector<std::pair<int64_t, std::pair<int32_t, double>>> entries;  // collect_touched
    SiteWork<S> site;                                                     // site-local path
  };

  // --- evaluator.cpp: set-up and orchestration
  void set_base(const double* base);
  void forward_prefix();
  S effective(int64_t param, double raw) const;
  void plan_groups(const Candidates& c);
  Decline build_terms(const Candidates& c, int64_t particle, std::vector<Term>& out,
                      int32_t& first) const;
  void run_groups(const Candidates& c, double* losses);
  void evaluate_group(const Candidates& c, const Group& g, Scratch& s, double* losses) const;
  double l2_term(const Candidates& c, const Group& g, int64_t cand, Scratch& s) const;
  void collect_touched(const Candidates& c, int64_t particle, Scratch& s) const;
  int64_t auto_chunk() const;
  double memory_estimate_bytes() const;

  // --- delta_path.cpp
  void evaluate_delta(const Candidates& c, const Group& g, Scratch& s, double* losses) const;
  void build_kink_tables();
  void apply_elementwise(const LayerPlan& layer, const S* in, S* out, int64_t count,
                         Scratch& s) const;
  // Sparse units at the input of affine layer l through l, relu l+1 and affine l+2 into
  // s.delta ([out_{l+2}, n * batch]) with the kink tables.
  void apply_kink(std::size_t l, int64_t n, Scratch& s) const;

  // --- materialised_paths.cpp (sample-major)
  void evaluate_dense(const Candidates& c, const Group& g, Scratch& s, double* losses) const;
  void evaluate_inplace(const Candidates& c, const Group& g, Scratch& s, double* losses);
  void evaluate_fallback(const Candidates& c, const Group& g, Scratch& s, double* losses) const;
  // One layer on sample-major rows. `params` are effective ones (transforms applied) for
  // native affine layers; with host_only every layer runs its host forward on raw params.
  void forward_layer(const LayerPlan& layer, const Mat<S>& in, const S* params, Mat<S>& out,
                     bool host_only = false) const;
  void set_candidate_params(const Candidates& c, int64_t cand, Scratch& s, S* eff) const;

  // --- site_local_path.cpp
  void build_site_plans();
  // Decline::none when the group can take the site-local path, else why not
  // (site_not_declared when its layers do not declare the contract at all).
  Decline site_local_decline(const Group& g, bool other_forced) const;
  void prepare_site_local();  // per call: the incumbent's attention internals
  void evaluate_site_local(const Candidates& c, const Group& g, Scratch& s, double* losses) const;

  // --- loss_kernels.cpp
  // Mean loss of candidates whose outputs are the incumbent's plus `delta`
  // (feature-major [outputs, n * batch]); sums in double in sample order.
  void delta_losses(const Mat<S>& delta, int64_t n, double* mean_losses, Scratch& s) const;
  // Mean loss of sample-major outputs rows [first, first + batch).
  double rows_loss(const Mat<S>& out, int64_t first_row) const;

  ModelPlan plan_;
  kernels::LossKind loss_;
  double l2_;
  int threads_;
  std::string forced_;  // "" = auto
  bool subspace_mode_ = false;
  const pp_subspace_view* subspace_ = nullptr;
  std::vector<int32_t> coord_u_, coord_v_;  // per subspace coordinate: dense u / v index
  std::vector<std::vector<S>> dense_u_;     // dense u vectors of subspace coordinates, in S
  std::vector<const double*> dense_v_;      // dense v vectors
  std::vector<Eigen::Matrix<S, 1, Eigen::Dynamic>> dense_v_s_;  // the same, in S
  std::vector<int32_t> dense_v_layer_;
  std::vector<int32_t> first_host_from_;  // first host layer index >= l (n_layers if none)
  std::unique_ptr<tbb::task_arena> arena_;
  int64_t chunk_ = 0;  // candidates a worker holds at once
  bool chunk_auto_ = true;
  int64_t chunk_halvings_ = 0;      // allocation failures survived by halving the chunk
  bool inplace_for_dense_ = false;  // per-thread parameter copies would not fit

  // batch
  Mat<S> x_;  // sample-major inputs
  std::vector<int64_t> labels_;
  std::vector<double> targets_;
  int64_t batch_ = 0;

  // per incumbent (recomputed when its version changes or a batch is registered)
  uint64_t incumbent_version_ = 0;
  bool incumbent_ready_ = false;
  std::vector<double> base_;
  std::vector<S> eff_;
  double base_sq_ = 0.0;
  uint64_t generation_ = 0;
  std::vector<Mat<S>> acts_;       // sample-major [batch, width], acts_[l] = input of layer l
  std::vector<Mat<S>> acts_t_;     // feature-major [width, batch]
  std::vector<Mat<S>> weights_t_;  // affine layers: effective W^T [in, out]
  Mat<S> v_src_;                   // [dense_v_, batch]: v^T (input of its layer)
  double base_loss_ = 0.0;
  // Cross-entropy from a logit delta: the incumbent's softmax and per-sample losses
  // ([classes, batch] and [batch]) and the labels as one-hot rows.
  Mat<S> probs_t_, one_hot_t_;
  Arr<S> sample_loss_;
  std::vector<Group> groups_;
  std::vector<Term> terms_;
  std::vector<int64_t> first_layer_candidates_;  // per layer: delta candidates starting there
  // Cross-entropy of a rank-one logit change dl = s_b g_{u,b} (loss_kernels.cpp): per
  // direction u and sample b, the first four cumulants of g under the incumbent's softmax,
  // pre-divided by n!, and the spread bound M = max_k |g_k - mean|. Float32 only.
  struct Cumulants {
    bool built = false;
    Mat<S> c1, c2, c3, c4, spread;  // [directions, batch]
  };
  // g(u, k, b) = g[u * su + k * sk + b * sb].
  void build_cumulants(Cumulants& table, int64_t directions, const S* g, int64_t su, int64_t sk,
                       int64_t sb) const;
  // The mean losses of n candidates whose logits change by s[i, b] g_{u,b}: g is column u
  // of the last layer's W (kink_layer < 0) or the kink response of layer kink_layer. Samples
  // outside the certified range, or whose ReLU units may cross a kink, are computed exactly.
  void rank_one_losses(const Cumulants& table, int64_t u, const Mat<S>& s_values, int64_t n,
                       int64_t kink_layer, double* mean_losses) const;
  // One sample's exact loss for the same change (b, s = the sample's scalar).
  S rank_one_exact(int64_t u, S s, int64_t b, int64_t kink_layer) const;
  // The same for a packet of samples [b, b + kLanes) at once, the logits and the loss
  // vectorised over the samples; the lanes whose bit is set in `crossing` may have ReLU units that
  // cross a kink (found by a vectorised scan of the hidden units, confirmed one by one).
  Packet<S> rank_one_exact_packet(int64_t u, const Packet<S>& s, int64_t b, int64_t kink_layer,
                                  uint32_t crossing) const;
  Cumulants last_layer_cumulants_;  // g = columns of the last affine layer's W

  // Kink tables of affine layer l (see delta_path.cpp), when built this call.
  struct KinkTable {
    bool built = false;
    Mat<S> response;  // [in_l * out_{l+2}, batch]
    Mat<S> inv_room;  // [in_l, batch]
    // One unit u moving by s > 0 makes a ReLU unit cross iff s * room_up(u, b) >= 1 (s < 0:
    // -s * room_down(u, b) >= 1): max_j of -W[j, u] / z_jb and of W[j, u] / z_jb.
    Mat<S> room_up, room_down;
    Mat<S> abs_weights;   // |W_l|^T [in_l, out_l], scratch of the build
    Cumulants cumulants;  // when layer l+2 is the last: g = response columns
  };
  std::vector<KinkTable> kink_;
  // Direction tables: a dense subspace direction u at the output of affine layer l, then
  // ReLU l+1 and affine l+2: response[:, b] = W_{l+2} diag(mask_b) u and the exact crossing
  // bounds for a move s u (as in KinkTable). Indexed by dense u; built when the pattern holds.
  struct DirectionTable {
    bool built = false;
    int32_t layer = -1;
    Mat<S> response;            // [out_{l+2}, batch]
    Arr<S> room_up, room_down;  // [batch]
  };
  std::vector<DirectionTable> direction_;
  std::vector<int32_t> dense_u_layer_;  // the layer of each dense u
  void build_direction_tables();
  // Terms along one dense u at layer l, through ReLU l+1 and affine l+2, into s.delta.
  void apply_direction(std::size_t l, int32_t u_index, int64_t n, Scratch& s) const;
  std::array<int64_t, kPathCount> path_candidates_{};
  std::vector<std::array<int64_t, kPathCount>> layer_path_candidates_;
  std::vector<std::array<int64_t, static_cast<int>(Decline::count)>> layer_declines_;
  std::vector<SiteLayer> site_;                // per layer (kind none unless site-local)
  const pp_host_api* host_ = nullptr;          // the host's operations (may be null)
  std::vector<Mat<S>> site_qkv_, site_mixed_;  // per call, attention layers in use

  tbb::enumerable_thread_specific<Scratch> scratch_;
  std::string explain_;
};

}  // namespace polyprobe::cpu_tbb
