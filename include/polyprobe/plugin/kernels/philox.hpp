// The optimizer's counter-based random stream: Philox4x32-10 (Salmon, Moraes, Dror and Shaw,
// "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the Random123 constants).
//
// Header-only, pure functions of their arguments: no std:: generator, no hidden state, no
// allocation. Draw number `block` of particle `particle` at optimizer step `step` under seed
// `seed` is the same four words on any thread, in any order, on any backend; a CUDA kernel
// includes this header and computes the same stream (the functions are __host__ __device__
// under nvcc). The integer stream is exact everywhere; the normals go through log, sqrt,
// cos and sin, whose last bit may differ between math libraries (CPU libm against CUDA's).
//
// Stream layout (what a backend must reproduce): counter = (block, step low 32 bits,
// particle low 32 bits, particle high 32 bits), key = (seed low 32 bits, seed high 32 bits
// xor step high 32 bits). Each block gives two 53-bit uniforms in (0, 1) and, by
// Box-Muller, two standard normals; normal j of a particle is element j % 2 of block j / 2.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define PP_PHILOX_FN __host__ __device__ inline
#else
#define PP_PHILOX_FN inline
#endif

namespace polyprobe::kernels {

struct PhiloxWords {
  uint32_t w[4];
};

// Philox4x32 with 10 rounds of the counter c under the key (k0, k1).
PP_PHILOX_FN PhiloxWords philox4x32_10(PhiloxWords c, uint32_t k0, uint32_t k1) {
  constexpr uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = kM0 * c.w[0];
    const uint64_t p1 = kM1 * c.w[2];
    const PhiloxWords next{
        {static_cast<uint32_t>(p1 >> 32) ^ c.w[1] ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c.w[3] ^ k1, static_cast<uint32_t>(p0)}};
    c = next;
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// Block `block` of the stream of (seed, step, particle), laid out as the header says.
PP_PHILOX_FN PhiloxWords particle_random_block(uint64_t seed, uint64_t step, uint64_t particle,
                                               uint32_t block) {
  const PhiloxWords counter{{block, static_cast<uint32_t>(step), static_cast<uint32_t>(particle),
                             static_cast<uint32_t>(particle >> 32)}};
  return philox4x32_10(counter, static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32) ^ static_cast<uint32_t>(step >> 32));
}

// A uniform double in (0, 1) from the words (hi, lo): 53 random bits, never 0 or 1.
PP_PHILOX_FN double philox_uniform(uint32_t hi, uint32_t lo) {
  const uint64_t bits = ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
  return (static_cast<double>(bits) + 0.5) * 0x1.0p-53;
}

// Normal draws 2 block and 2 block + 1 of (seed, step, particle): Box-Muller on the block's
// two uniforms.
PP_PHILOX_FN void particle_normal_pair(uint64_t seed, uint64_t step, uint64_t particle,
                                       uint32_t block, double out[2]) {
  const PhiloxWords r = particle_random_block(seed, step, particle, block);
  const double radius = std::sqrt(-2.0 * std::log(philox_uniform(r.w[0], r.w[1])));
  const double angle = 6.283185307179586476925 * philox_uniform(r.w[2], r.w[3]);
  out[0] = radius * std::cos(angle);
  out[1] = radius * std::sin(angle);
}

}  // namespace polyprobe::kernels

#undef PP_PHILOX_FN
