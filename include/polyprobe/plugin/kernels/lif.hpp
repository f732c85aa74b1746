// The firing rates of leaky integrate-and-fire neurons driven by constant currents, shared
// by the core's lif layer and the CPU backends so that one definition serves both.
#pragma once

#include <algorithm>
#include <cstdint>

namespace polyprobe::kernels {

// rate[i] = (spikes of a neuron fed current[i] for `steps` steps) / steps, where
// v_t = beta * v_{t-1} + current, a spike when v_t >= threshold, then v_t -= threshold (or
// v_t = 0 with reset_to_zero), v_0 = 0. Blocks of neurons step together without branches
// (a spike selects the reset), so the loop vectorises; each neuron sees the same operations
// in the same order as a scalar loop would.
template <class S>
void lif_rates(const S* current, S* rate, int64_t count, int64_t steps, S beta, S threshold,
               bool reset_to_zero) {
  constexpr int64_t kBlock = 64;
  S v[kBlock], spikes[kBlock];
  for (int64_t first = 0; first < count; first += kBlock) {
    const int64_t n = std::min(kBlock, count - first);
    const S* in = current + first;
    for (int64_t i = 0; i < n; ++i) v[i] = spikes[i] = S(0);
    for (int64_t t = 0; t < steps; ++t)
      for (int64_t i = 0; i < n; ++i) {
        const S u = beta * v[i] + in[i];
        const bool fire = u >= threshold;
        spikes[i] += fire ? S(1) : S(0);
        v[i] = fire ? (reset_to_zero ? S(0) : u - threshold) : u;
      }
    for (int64_t i = 0; i < n; ++i) rate[first + i] = spikes[i] / static_cast<S>(steps);
  }
}

}  // namespace polyprobe::kernels
