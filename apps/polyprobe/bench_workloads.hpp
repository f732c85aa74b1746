// The reference workloads of /work/shared/bench/README.md for the C++ benchmarks and
// `polyprobe explain`: the same layer sizes, batch, search space, particle dimension,
// simplex template, Haar rotations and probe displacement (0.5 r R_i t_v, r = 1e-2), with
// seeded random data (PyTorch's random streams are not reproduced).
#pragma once

#include <polyprobe/candidates.hpp>
#include <polyprobe/geometry.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/registry.hpp>
#include <polyprobe/subspaces.hpp>

#include <memory>
#include <string>
#include <vector>

namespace polyprobe::app {

struct WorkloadSpec {
  std::string name;
  std::vector<int64_t> sizes;  // layer widths, input first; empty: a structured model (below)
  int64_t batch;
  int64_t subspace_dim;  // 0 = full space; > 0 the hybrid budget; kNoBudget: rank alone
  int32_t d;
  PolytopeKind polytope = PolytopeKind::simplex;
  int64_t factored_rank = 0;  // > 0: the factored subspace of this rank (its plugin) instead
  bool named_only = false;    // GPU-sized: left out of "all", run when named
};
inline constexpr int64_t kNoBudget = -1;

// mlp64-full, mlp256-full, mlp256-sub512, mnist128-sub256, mnist64-full (the PyTorch
// reference's MLPs), then the structured models of the site-local path: conv-digits (the
// embedded 8x8 digits as [1, 8, 8]: conv2d 1->8 k3 pad 1, relu, conv2d 8->16 k3 stride 2
// pad 1, relu, flatten, linear -> 10) and attn-tokens (seeded random tokens [16, 32]:
// self_attention with 4 heads, flatten, linear -> 10); batch 32, full space, d = 2; and
// mnist128-rank8, polystep's own MNIST example: 784-128-10 on N(0,1) inputs, batch 512, the
// hybrid subspace of rank 8 with no budget, orthoplex, d = 8. Then the factored subspace
// against the others at equal dimension, 784-128-10, batch 64: mnist128-factored-r2 (the
// plugin factored_subspace, rank 2: 414 coordinates, d = 8), mnist128-sub414 (hybrid, budget
// 414, d = 8) and mnist128-full (full space, d = 2). Last mlp256-deep, 64-256-256-256-10 at
// batch 32, full space, d = 2: its first layer's candidates run two 256 x 256 layers densely
// (no fused tail reaches that far), the GEMMs candidate_autocast takes to the tensor cores.
// Named only (not in "all"), sized for a GPU: attn-long (Gaussian tokens [1024, 32]: softmax
// self_attention with 4 heads, per-position linear -> 1, flatten, linear -> 10, batch 8) and
// cheri-seq (Gaussian [1024, 128]: the seed's Cheri block, dilation 4, expansion 2, then the
// same head, batch 64).
const std::vector<WorkloadSpec>& reference_workloads();
const WorkloadSpec& find_workload(const std::string& name);

// A built workload. One step's candidates are every particle at every simplex vertex.
struct Workload {
  WorkloadSpec spec;
  std::unique_ptr<Model> model;
  std::unique_ptr<Loss> loss;
  Batch batch;
  std::unique_ptr<Subspace> subspace;  // null in full space
  ParticleMap particles;
  int32_t vertices = 0;              // V = d + 1 (simplex) or 2 d (orthoplex)
  std::vector<double> simplex;       // [V * d]: the template (the simplex unless spec says)
  std::vector<double> rotations;     // [P * d * d], float32 values
  std::vector<int64_t> particle;     // [C]
  std::vector<double> displacement;  // [C * d]

  int64_t candidates() const { return static_cast<int64_t>(particle.size()); }
  CandidateSet set() const { return {&particles, particle, displacement}; }
  // displacement = 0.5 r R_i t_v for every candidate: part of every timed step.
  void compute_displacements();
  // FLOPs of one step on the cpu_tbb delta paths (an estimate of the work they do; full
  // space only, 0 in a subspace) and on a dense path (every candidate's suffix of GEMMs
  // from its first changed layer).
  double delta_flops() const;
  double dense_flops() const;
};

// `registry` (may be null) provides the factored subspace of the factored workloads; without
// it, or without its plugin, they are an Error that says so.
Workload build_workload(const WorkloadSpec& spec, uint64_t seed = 0,
                        const PluginRegistry* registry = nullptr);

// The optimizer of `bench step`'s complete steps on `w` in `regime` (step@reference: the
// reference's radius, the fixed radius model; step@train: train's default radii and the
// quadratic model), with a constant schedule so every timed step is alike (bench_step.cpp).
OptimizerConfig complete_step_config(const Workload& w, const std::string& regime);

}  // namespace polyprobe::app
