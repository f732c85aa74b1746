// The transport half of an optimizer step on the device (pp_transport_request): the cost
// matrix from the step's losses, the solve, the barycentric move and the quadratic model's
// sums, with the core's formulas (core/optimizer/step_engine.cpp, transport.cpp and
// radius_model.cpp), so the [P V K] losses never leave the device. Also the step's directions
// from its rotations, so only per-particle data goes up.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace polyprobe::cuda {

// The largest particle dimension the transport kernel holds in registers.
inline constexpr int32_t kTransportMaxDim = 16;

// directions[(i V + v) d + j] = sum_c R_i[j, c] t_v[c]: R [P d d] row-major, polytope [V d].
void launch_directions(const double* rotations, const double* polytope, int64_t particles,
                       int32_t vertices, int32_t d, double* directions, cudaStream_t stream);

// rotations [P 2 2] row-major: particle i's plane rotation at `step` of the optimizer's
// stream under `seed` (kernels/plane_rotation.hpp), the host's bits.
void launch_plane_rotations(uint64_t seed, uint64_t step, int64_t particles, double* rotations,
                            cudaStream_t stream);

// What one launch solves: P particles of dimension d with V vertices and K probes, the losses
// [P V K] and directions [P V d] already on the device.
struct TransportProblem {
  int64_t particles = 0;
  int32_t vertices = 0, probes = 1, d = 0;
  const double* losses = nullptr;      // [P V K]
  const double* directions = nullptr;  // [P V d]
  int32_t solver = PP_SOLVER_SOFTMAX;
  int32_t top_k = 1;
  int32_t sinkhorn_max_iterations = 0;
  double sinkhorn_tolerance = 0;
  double temperature = 1;
  int32_t cost_scaling = PP_COST_SCALING_NONE;
  double nonfinite_margin = 10;
  int64_t n_blocks = 0;
  const int64_t* block_first = nullptr;  // device [n_blocks]
  const int64_t* block_count = nullptr;  // device [n_blocks]
  double step_radius = 0;
  double* duals_f = nullptr;             // device [P] (sinkhorn)
  double* duals_g = nullptr;             // device [n_blocks V] (sinkhorn)
  const uint8_t* duals_fresh = nullptr;  // device [n_blocks] (sinkhorn)
  const double* incumbents = nullptr;    // device [1 or P]; null = no quadratic model
  int64_t n_incumbents = 0;
  double scaled_radius = 0;
  double* cost = nullptr;                // device scratch [P V]
  double* weights = nullptr;             // device [P V]
  double* moves = nullptr;               // device [P d]
  pp_transport_block* blocks = nullptr;  // device [n_blocks]
  // For the blocks of many rows, solved by the whole grid: the host's copy of block_count
  // and transport_grid_scratch() doubles of device scratch. Either null: one thread block
  // solves every block.
  const int64_t* host_block_count = nullptr;
  double* grid_partials = nullptr;
  int64_t grid_rows = 0;  // set by launch_transport: blocks of this many rows or more use the grid
};

// The doubles of device scratch that TransportProblem::grid_partials needs.
std::size_t transport_grid_scratch();

// One thread block per transport block, except that a block of many rows (a monolithic step
// over every particle) is solved by a cooperative grid of a fixed number of thread blocks,
// each a contiguous slice of its rows. Every reduction adds per-thread partials in a fixed
// tree, then the thread blocks' results in block order, so the result does not depend on
// timing.
void launch_transport(const TransportProblem& problem, cudaStream_t stream);

}  // namespace polyprobe::cuda
