// The cumulant series of a rank-one logit change (kernels/cgf_series.hpp) against the exact
// loss change in extended precision: within its certified bound over the whole range it is
// used in, for peaked and flat softmaxes, few and many classes, both signs of s.
#include <polyprobe/plugin/kernels/cgf_series.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace polyprobe::test {
namespace {

using kernels::cgf_remainder_bound;
using kernels::cgf_series;
using kernels::kCgfLimit;
using kernels::kCgfTerms;

// log sum_k p_k exp(s g_k) - s g_y in long double, about the mean (no overflow at large s).
long double exact_change(const std::vector<double>& p, const std::vector<double>& g, int y,
                         double s) {
  long double mean = 0;
  for (std::size_t k = 0; k < p.size(); ++k) mean += static_cast<long double>(p[k]) * g[k];
  long double sum = 0;
  for (std::size_t k = 0; k < p.size(); ++k)
    sum += static_cast<long double>(p[k]) * std::exp(static_cast<long double>(s) * (g[k] - mean));
  return std::log(sum) + static_cast<long double>(s) * (mean - g[static_cast<std::size_t>(y)]);
}

TEST_CASE("cgf series: within its certified bound up to the limit it is used at", "[kernels]") {
  // What the float32 kernels rely on: truncation below 1.1e-9 per sample at the limit.
  CHECK(cgf_remainder_bound(kCgfLimit) <= 1.1e-9);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal;
  double worst_ratio = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int classes = 2 + trial % 15;
    const double temperature = trial % 3 == 0 ? 6.0 : 1.0;  // peaked softmaxes too
    const double scale = trial % 7 == 0 ? 10.0 : 1.0;
    std::vector<double> z(static_cast<std::size_t>(classes)), g(z.size()), p(z.size());
    for (std::size_t k = 0; k < z.size(); ++k) {
      z[k] = temperature * normal(rng);
      g[k] = scale * normal(rng);
    }
    const double top = *std::max_element(z.begin(), z.end());
    double total = 0;
    for (std::size_t k = 0; k < z.size(); ++k) total += p[k] = std::exp(z[k] - top);
    for (double& v : p) v /= total;
    const int y = trial % classes;
    double coef[kCgfTerms];
    const double spread = cgf_series(p.data(), g.data(), classes, 1, y, coef);
    REQUIRE(spread > 0);
    for (const double q : {0.01, 0.05, 0.1, 0.2, 0.3, kCgfLimit})
      for (const double sign : {-1.0, 1.0}) {
        const double s = sign * q / spread;
        double poly = 0;
        for (int t = kCgfTerms - 1; t >= 0; --t) poly = poly * s + coef[t];
        poly *= s;
        const long double exact = exact_change(p, g, y, s);
        // Truncation (the bound) plus float64 rounding of the linear term and the sum.
        const double rounding =
            1e-13 * (1 + std::abs(s) * (std::abs(g[static_cast<std::size_t>(y)]) + spread) +
                     std::abs(static_cast<double>(exact)));
        const double error = std::abs(static_cast<double>(exact - poly));
        worst_ratio = std::max(worst_ratio, error / (cgf_remainder_bound(q) + rounding));
      }
  }
  INFO("worst error / allowance " << worst_ratio);
  CHECK(worst_ratio <= 1.0);
}

}  // namespace
}  // namespace polyprobe::test
