// candidate_autocast (--candidate-dtype bf16|fp16) on the cuda plugin: the reduced-precision
// candidates must rank as float32's do (Spearman's rho above 0.99 over each reference
// workload's cost matrix, at the reference's probe displacement and at train's), the
// candidates that autocast does not cover must be float32's to the bit, and what it cannot
// run is refused with the reason. Needs a CUDA device; without one each case exits with 77
// (ctest: skipped).
#include "bench_workloads.hpp"
#include "cuda/cuda_backends.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

using namespace polyprobe;
using polyprobe::testing::backends;
using polyprobe::testing::require_device;

namespace {

// Ranks 1..n with ties given their average rank.
std::vector<double> ranks(const std::vector<double>& x) {
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return x[a] < x[b]; });
  std::vector<double> r(x.size());
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) ++j;
    const double average = 0.5 * static_cast<double>(i + j) + 1.0;
    for (std::size_t k = i; k <= j; ++k) r[order[k]] = average;
    i = j + 1;
  }
  return r;
}

// Spearman's rank correlation: Pearson's on the ranks.
double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n;
  const double mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

TEST_CASE("spearman: identical, reversed and tied rankings") {
  CHECK(spearman({1, 2, 3, 4}, {10, 20, 30, 40}) == Approx(1.0));
  CHECK(spearman({1, 2, 3, 4}, {4, 3, 2, 1}) == Approx(-1.0));
  CHECK(spearman({1, 1, 2, 3}, {5, 5, 6, 7}) == Approx(1.0));
  CHECK(spearman({1, 2, 3, 4, 5}, {2, 1, 4, 3, 5}) == Approx(0.8));
}

std::unique_ptr<Evaluator> cuda_evaluator(const app::Workload& w, CandidateDType candidates) {
  EvaluatorRequest request;
  request.backend = "cuda";
  request.device = "cuda";
  request.options.dtype = DType::f32;
  request.options.candidate_dtype = candidates;
  request.subspace = w.subspace.get();
  auto evaluator = backends().registry.make_evaluator(*w.model, *w.loss, request);
  evaluator->register_batch(w.batch);
  return evaluator;
}

struct Scored {
  std::vector<double> losses;
  double incumbent = 0;
  int64_t autocast_candidates = 0;
};

Scored score(Evaluator& evaluator, app::Workload& w) {
  Scored s;
  s.losses.resize(static_cast<std::size_t>(w.candidates()));
  s.incumbent = evaluator.evaluate_base(w.model->parameters());
  evaluator.evaluate(w.model->parameters(), w.set(), s.losses);
  const nlohmann::json plugin = evaluator.explain().value("plugin", nlohmann::json::object());
  if (plugin.contains("autocast")) s.autocast_candidates = plugin["autocast"]["last_candidates"];
  return s;
}

}  // namespace

TEST_CASE("candidate_autocast ranks the reference workloads' candidates as float32 does") {
  require_device();
  // The MLP workloads (autocast covers linear + activation models); the probe displacement
  // of the reference (0.5 x 1e-2) and of train's defaults (0.3, 60 times as far).
  for (const char* name : {"mlp64-full", "mlp256-full", "mlp256-sub512", "mnist64-full",
                           "mnist128-sub256", "mlp256-deep"}) {
    for (const double scale : {1.0, 60.0}) {
      app::Workload w = app::build_workload(app::find_workload(name));
      for (double& x : w.displacement) x *= scale;
      auto f32 = cuda_evaluator(w, CandidateDType::compute);
      const Scored base = score(*f32, w);
      double widest = 0;  // the largest loss change among the candidates, in float32
      for (const double l : base.losses) widest = std::max(widest, std::abs(l - base.incumbent));
      for (const CandidateDType reduced : {CandidateDType::bf16, CandidateDType::fp16}) {
        auto evaluator = cuda_evaluator(w, reduced);
        const Scored got = score(*evaluator, w);
        const double rho = spearman(base.losses, got.losses);
        int64_t differ = 0;
        double worst = 0;
        for (std::size_t c = 0; c < got.losses.size(); ++c) {
          differ += got.losses[c] != base.losses[c];
          worst = std::max(worst, std::abs(got.losses[c] - base.losses[c]));
        }
        INFO(name << " x" << scale << " " << to_string(reduced) << ": rho " << rho << ", "
                  << got.autocast_candidates << " of " << got.losses.size()
                  << " candidates autocast, " << differ << " differ from float32, worst " << worst
                  << " (widest change " << widest << ")");
        std::printf("%s x%g %s: spearman %.7f, %lld of %zu candidates autocast\n", name, scale,
                    std::string(to_string(reduced)).c_str(), rho,
                    static_cast<long long>(got.autocast_candidates), got.losses.size());
        CHECK(rho > 0.99);
        // The incumbent is float32's: autocast covers only candidates.
        CHECK(got.incumbent == base.incumbent);
        // Rounding costs a fraction of each change, never more than the changes themselves.
        CHECK(worst <= 0.05 * widest + 1e-7);
        if (got.autocast_candidates == 0) {
          // Nothing ran reduced (every particle has a fused tail of sparse changes): float32's
          // bits.
          CHECK(differ == 0);
        } else {
          // Some did run reduced: their losses moved.
          CHECK(differ > 0);
        }
      }
    }
  }
}

TEST_CASE("candidate_autocast runs the dense layers of a deep MLP reduced, the fused tails not") {
  require_device();
  // mlp256-deep (64-256-256-256-10): the first layer's candidates run two 256 x 256 layers
  // on the general path, reduced; every later particle has a fused tail of sparse changes,
  // which stays float32 (a rank-one update is cheaper than a GEMM).
  app::Workload w = app::build_workload(app::find_workload("mlp256-deep"));
  auto f32 = cuda_evaluator(w, CandidateDType::compute);
  auto bf16 = cuda_evaluator(w, CandidateDType::bf16);
  const Scored base = score(*f32, w), got = score(*bf16, w);
  const nlohmann::json plugin = bf16->explain()["plugin"];
  CHECK(plugin["candidate_dtype"] == "bf16");
  CHECK(f32->explain()["plugin"]["candidate_dtype"] == "float32");
  // 64 x 256 + 256 first-layer parameters in particles of 2, at V = 3 vertices.
  const int64_t first_layer = (64 * 256 + 256) / 2 * 3;
  CHECK(got.autocast_candidates == first_layer);
  int64_t differ = 0;
  for (std::size_t c = 0; c < static_cast<std::size_t>(first_layer); ++c)
    differ += got.losses[c] != base.losses[c];
  CHECK(differ > first_layer / 2);
  for (std::size_t c = static_cast<std::size_t>(first_layer); c < got.losses.size(); ++c)
    REQUIRE(got.losses[c] == base.losses[c]);
}

TEST_CASE("candidate_autocast refuses what it cannot run, with the reason") {
  require_device();
  app::Workload mlp = app::build_workload(app::find_workload("mlp64-full"));
  EvaluatorRequest request;
  request.backend = "cuda";
  request.device = "cuda";
  request.options.candidate_dtype = CandidateDType::bf16;
  SECTION("a float64 session") {
    request.options.dtype = DType::f64;
    CHECK_THROWS_WITH(backends().registry.make_evaluator(*mlp.model, *mlp.loss, request),
                      Catch::Contains("use --dtype float32"));
  }
  SECTION("the dense and materialised paths") {
    request.options.dtype = DType::f32;
    for (const char* path : {"dense", "materialised"}) {
      request.path = path;
      CHECK_THROWS_WITH(backends().registry.make_evaluator(*mlp.model, *mlp.loss, request),
                        Catch::Contains("candidate_autocast runs on the layered delta path"));
    }
  }
  SECTION("a model with a conv layer, named") {
    request.options.dtype = DType::f32;
    app::Workload conv = app::build_workload(app::find_workload("conv-digits"));
    CHECK_THROWS_WITH(backends().registry.make_evaluator(*conv.model, *conv.loss, request),
                      Catch::Contains("layer 0 (conv2d)") && Catch::Contains("float32"));
  }
}
