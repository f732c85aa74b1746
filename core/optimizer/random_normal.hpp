// Standard normal draws that depend only on the std::mt19937_64 stream.
//
// std::normal_distribution is implementation-defined and caches a value between calls, which
// would make trajectories differ between standard libraries and checkpoints miss hidden
// state. Box-Muller on 53-bit uniforms from the generator has neither problem.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <span>

namespace polyprobe {

// A uniform double in (0, 1): 53 random bits, never 0 so that log() is finite.
inline double uniform_open01(std::mt19937_64& rng) {
  return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
}

// Fills `out` with independent N(0, 1) draws, two per pair of uniforms.
inline void fill_standard_normal(std::mt19937_64& rng, std::span<double> out) {
  for (std::size_t i = 0; i < out.size(); i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(uniform_open01(rng)));
    const double angle = 2.0 * std::numbers::pi * uniform_open01(rng);
    out[i] = radius * std::cos(angle);
    if (i + 1 < out.size()) out[i + 1] = radius * std::sin(angle);
  }
}

}  // namespace polyprobe
