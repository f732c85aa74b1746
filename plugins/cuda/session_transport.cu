// The transport half of a step on a CUDA session: the step's losses stay on the device for
// the solve and the move (transport.cuh; session_impl.cuh).
#include "session_impl.cuh"

namespace polyprobe::cuda {

template <class T>
void DeviceSession<T>::transport(const pp_transport_request& request) {
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
  if (sinkhorn &&
      (request.duals_f == nullptr || request.duals_g == nullptr || request.duals_fresh == nullptr))
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

// The members defined here, for both compute types.
template void DeviceSession<float>::transport(const pp_transport_request& request);
template void DeviceSession<double>::transport(const pp_transport_request& request);

}  // namespace polyprobe::cuda
