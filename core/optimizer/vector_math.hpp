// Elementwise exp and sin/cos for the optimizer's per-particle passes (internal),
// written without calls or branches so that the compiler vectorises the loops over them.
//
// Why: a step's transport takes about 2 P V exponentials per Sinkhorn iteration and P
// logarithms, and a d = 2 step one sine and cosine per particle. libm answers each with a
// scalar call, which was 13% of a complete full-space step at train's radii (mnist64-full,
// perf: __sincos_fma 5.5%, exp 6.3%, log 1.2%).
//
// The loops over them (exp_in_place, cos_sin_turns) are built for AVX-512, AVX2 and the
// baseline, chosen when the library loads: the core's baseline (SSE2, two lanes, no
// blends) is no faster than libm's scalar exp, AVX-512 is 7x faster for exp and 40x for
// sincos (measured on this project's AMD EPYC development machine).
//
// Accuracy (tests/optimizer/test_vector_math.cpp checks it against long double): within
// 2 ulp of the exact result on the stated domains. (log stays libm's: one per row, and a
// polynomial one needs a division, which costs what the call does.) The bits do not depend on the
// vector width or the thread count (the project compiles without FMA contraction, -std=c++20), so
// the trajectory stays a pure function of seed and data and is the same whichever clone runs; they
// may differ from libm's in the last place.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace polyprobe::detail {

// e^x. Domain: x <= 709 (above it +inf, where libm overflows only past 709.78); x < -708
// gives 0 (libm's subnormals, below 1e-307, are dropped); NaN stays NaN.
inline double vector_exp(double x) {
  constexpr double kLog2e = 1.4426950408889634074;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2 with 21 low bits zero
  constexpr double kLn2Lo = 1.90821492927058770002e-10;  // ln 2 - kLn2Hi
  constexpr double kShift = 0x1.8p52;  // adding it rounds to an integer, kept in the low bits
  const double xc = x < -708.0 ? -708.0 : (x > 709.0 ? 709.0 : x);
  const double t = xc * kLog2e + kShift;
  const double n = t - kShift;                      // round(x / ln 2), |n| <= 1023
  const double r = (xc - n * kLn2Hi) - n * kLn2Lo;  // |r| <= ln 2 / 2, n * kLn2Hi exact
  // Taylor to r^13: the remainder is below 4e-18 relative on |r| <= 0.347.
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^n from n's bits in t: bits(t) = bits(kShift) + n.
  const uint64_t n_bits = std::bit_cast<uint64_t>(t) - std::bit_cast<uint64_t>(kShift);
  const double scale = std::bit_cast<double>((n_bits + 1023U) << 52U);
  const double y = p * scale;
  return x < -708.0 ? 0.0 : (x > 709.0 ? std::numeric_limits<double>::infinity() : y);
}

// x[i] = vector_exp(x[i]) for i < n.
void exp_in_place(double* x, std::ptrdiff_t n);
// (c[i], s[i]) = kernels::cos_sin_turn(u[i]) for i < n (kernels/plane_rotation.hpp, shared
// with device backends that draw rotations); the arrays do not overlap.
void cos_sin_turns(const double* u, double* c, double* s, std::ptrdiff_t n);

}  // namespace polyprobe::detail
