// The optimizer's rotations of particles of dimension 2, as pure functions a CUDA kernel can
// call: a backend that draws a step's rotations on its device (pp_score_request::
// rotations_from_stream) computes the host's bits with these.
//
// SO(2) is the circle, so particle p's rotation at step t is [c -s; s c] with (c, s) the cosine
// and sine of 2 pi u, u the first uniform of block 0 of the particle's Philox stream
// (philox.hpp). The cosine and sine are polynomials evaluated with explicitly rounded
// products and sums (never contracted into fused multiply-adds), so host and device give the
// same bits whatever their compilers' contraction settings; within 2 ulp of the exact values
// (tests/optimizer/test_vector_math.cpp).
#pragma once

#include <polyprobe/plugin/kernels/philox.hpp>

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PP_PLANE_FN __host__ __device__ inline
#else
#define PP_PLANE_FN inline
#endif

namespace polyprobe::kernels {

namespace plane_detail {
// a * b and a + b rounded once each, on the host and on a device alike.
PP_PLANE_FN double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
PP_PLANE_FN double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
PP_PLANE_FN uint64_t bits_of(double x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}
PP_PLANE_FN double double_of(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x = 0;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}
}  // namespace plane_detail

struct CosSin {
  double c, s;
};

// cos and sin of 2 pi u for u in [0, 1) (a uniform draw's angle): u's quadrant is exact in
// binary, so the polynomials only ever see |angle| <= pi / 4.
PP_PLANE_FN CosSin cos_sin_turn(double u) {
  using plane_detail::add;
  using plane_detail::bits_of;
  using plane_detail::double_of;
  using plane_detail::mul;
  constexpr double kHalfPi = 1.5707963267948966192;
  constexpr double kShift = 0x1.8p52;  // adding it rounds to an integer, kept in the low bits
  const double q = mul(u, 4.0);        // exact
  const double t = add(q, kShift);
  const double a = mul(add(q, -add(t, -kShift)), kHalfPi), a2 = mul(a, a);  // |a| <= pi / 4
  // Taylor to a^15 (sin) and a^16 (cos): remainders below 5e-17 and 2e-18.
  double ps = -1.0 / 1307674368000.0;  // -1/15!
  ps = add(mul(ps, a2), 1.0 / 6227020800.0);
  ps = add(mul(ps, a2), -1.0 / 39916800.0);
  ps = add(mul(ps, a2), 1.0 / 362880.0);
  ps = add(mul(ps, a2), -1.0 / 5040.0);
  ps = add(mul(ps, a2), 1.0 / 120.0);
  ps = add(mul(ps, a2), -1.0 / 6.0);
  const double sin_a = add(a, mul(mul(a, a2), ps));
  double pc = 1.0 / 20922789888000.0;  // 1/16!
  pc = add(mul(pc, a2), -1.0 / 87178291200.0);
  pc = add(mul(pc, a2), 1.0 / 479001600.0);
  pc = add(mul(pc, a2), -1.0 / 3628800.0);
  pc = add(mul(pc, a2), 1.0 / 40320.0);
  pc = add(mul(pc, a2), -1.0 / 720.0);
  pc = add(mul(pc, a2), 1.0 / 24.0);
  pc = add(mul(pc, a2), -0.5);
  const double cos_a = add(1.0, mul(a2, pc));
  // Quarter turns k (mod 4) map (cos a, sin a) to (cos, sin) of the angle: k = 1 gives
  // (-sin a, cos a), k = 2 (-cos a, -sin a), k = 3 (sin a, -cos a).
  const uint64_t k = bits_of(t) - bits_of(kShift);
  const bool swap = (k & 1U) != 0;
  const uint64_t flip_c = ((k + 1U) & 2U) << 62U, flip_s = (k & 2U) << 62U;
  const double c = double_of(bits_of(swap ? sin_a : cos_a) ^ flip_c);
  const double s = double_of(bits_of(swap ? cos_a : sin_a) ^ flip_s);
  return {c, s};
}

// The turn u of particle `particle`'s rotation at step `step` under `seed`.
PP_PLANE_FN double plane_rotation_turn(uint64_t seed, uint64_t step, uint64_t particle) {
  const PhiloxWords r = particle_random_block(seed, step, particle, 0);
  return philox_uniform(r.w[0], r.w[1]);
}

// Particle `particle`'s rotation at step `step` under `seed`, row-major [c -s; s c] into r[4].
PP_PLANE_FN void plane_rotation(uint64_t seed, uint64_t step, uint64_t particle, double r[4]) {
  const CosSin cs = cos_sin_turn(plane_rotation_turn(seed, step, particle));
  r[0] = cs.c;
  r[1] = -cs.s;
  r[2] = cs.s;
  r[3] = cs.c;
}

}  // namespace polyprobe::kernels

#undef PP_PLANE_FN
