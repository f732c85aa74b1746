// The optimizer's vectorisable exp and sin/cos (core/optimizer/vector_math.hpp) against long
// double's, in units in the last place of the double result, over their whole domains.
#include "optimizer/vector_math.hpp"

#include <polyprobe/plugin/kernels/plane_rotation.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

using polyprobe::detail::vector_exp;
using polyprobe::kernels::cos_sin_turn;

namespace {

// |got - want| in units of the last place of `want` rounded to double.
double ulps(double got, long double want) {
  const auto rounded = static_cast<double>(want);
  if (rounded == 0.0) return got == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  const double ulp = std::nextafter(std::abs(rounded), std::numeric_limits<double>::infinity()) -
                     std::abs(rounded);
  return static_cast<double>(std::abs(static_cast<long double>(got) - want) / ulp);
}

}  // namespace

TEST_CASE("vector_exp is within 2 ulp of exp over its domain, with its stated edges") {
  std::mt19937_64 rng(7);
  double worst = 0;
  // The transport's arguments are <= 0 and mostly near it; cover all of [-708, 709] too.
  for (const auto& [lo, hi] : {std::pair{-1.0, 0.0}, {-40.0, 40.0}, {-708.0, 709.0}}) {
    std::uniform_real_distribution<double> draw(lo, hi);
    for (int i = 0; i < 200000; ++i) {
      const double x = draw(rng);
      worst = std::max(worst, ulps(vector_exp(x), std::exp(static_cast<long double>(x))));
    }
  }
  INFO("worst error " << worst << " ulp");
  CHECK(worst <= 2.0);
  CHECK(vector_exp(0.0) == 1.0);
  CHECK(vector_exp(-709.0) == 0.0);
  CHECK(vector_exp(-std::numeric_limits<double>::infinity()) == 0.0);
  CHECK(std::isinf(vector_exp(709.5)));
  CHECK(std::isinf(vector_exp(std::numeric_limits<double>::infinity())));
  CHECK(std::isnan(vector_exp(std::numeric_limits<double>::quiet_NaN())));
  // Monotone across the steps of its range reduction (n changes at odd multiples of ln2/2).
  for (int n = -40; n <= 40; ++n) {
    const double edge = (n + 0.5) * std::log(2.0);
    CHECK(vector_exp(std::nextafter(edge, -1e9)) <= vector_exp(std::nextafter(edge, 1e9)));
  }
}

TEST_CASE("cos_sin_turn is within 2 ulp of cos and sin of 2 pi u, on the unit circle") {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> draw(0.0, 1.0);
  const long double two_pi = 2.0L * 3.141592653589793238462643383279502884L;
  double worst = 0, worst_norm = 0;
  auto check = [&](double u) {
    const auto [c, s] = cos_sin_turn(u);
    // Far from the axes only: near a zero of sin or cos an ulp of the result is tiny, and
    // the angle 2 pi u itself carries an error of an ulp of u.
    const long double angle = two_pi * static_cast<long double>(u);
    const long double want_c = std::cos(angle), want_s = std::sin(angle);
    if (std::abs(want_c) > 0.125L) worst = std::max(worst, ulps(c, want_c));
    if (std::abs(want_s) > 0.125L) worst = std::max(worst, ulps(s, want_s));
    worst_norm = std::max(worst_norm, std::abs(c * c + s * s - 1.0));
    CHECK(std::abs(static_cast<long double>(c) - want_c) < 1e-15L);
    CHECK(std::abs(static_cast<long double>(s) - want_s) < 1e-15L);
  };
  for (int i = 0; i < 200000; ++i) check(draw(rng));
  for (const double u : {0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, std::nextafter(1.0, 0.0),
                         std::nextafter(0.25, 0.0)})
    check(u);
  INFO("worst error " << worst << " ulp, worst |c^2 + s^2 - 1| " << worst_norm);
  CHECK(worst <= 2.0);
  CHECK(worst_norm <= 4 * std::numeric_limits<double>::epsilon());
  const auto [c0, s0] = cos_sin_turn(0.0);
  CHECK(c0 == 1.0);
  CHECK(s0 == 0.0);
  const auto [c1, s1] = cos_sin_turn(0.25);
  CHECK(c1 == 0.0);
  CHECK(s1 == 1.0);
}
