// Reading a chunk's candidates on the device (CandidateSource, kernels.cuh): which particle
// a candidate moves, its displacement computed as the host computes it, and where its loss
// goes. Shared by every kernel that generates candidates.
#pragma once

#include "kernels.cuh"

#include <cstdint>

namespace polyprobe::cuda {

__device__ inline int64_t particle_of(const CandidateSource& s, int64_t c) {
  const int64_t g = s.first + c;
  if (s.polytope) return s.active[g / (static_cast<int64_t>(s.vertices) * s.probes)];
  return s.particle[g];
}

// The displacement of coordinate j, computed in double exactly as the host does it:
// (probe_radius * k) / (K + 1.0) * direction.
__device__ inline double delta_of(const CandidateSource& s, int64_t c, int32_t j) {
  const int64_t g = s.first + c;
  if (!s.polytope) return s.displacement[g * s.d + j];
  const int64_t vk = static_cast<int64_t>(s.vertices) * s.probes;
  const int64_t p = s.active[g / vk];
  const int64_t r = g % vk;
  const int64_t v = r / s.probes;
  const int32_t k = static_cast<int32_t>(r % s.probes) + 1;
  const double scale = s.probe_radius * k / (s.probes + 1.0);
  return scale * s.directions[(p * s.vertices + v) * s.d + j];
}

// The slot of candidate c's loss: its index in the whole set (polytope form: P V K order).
__device__ inline int64_t target_of(const CandidateSource& s, int64_t c) {
  const int64_t g = s.first + c;
  if (!s.polytope) return g;
  const int64_t vk = static_cast<int64_t>(s.vertices) * s.probes;
  return s.active[g / vk] * vk + g % vk;
}

}  // namespace polyprobe::cuda
