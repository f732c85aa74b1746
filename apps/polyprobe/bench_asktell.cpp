// `polyprobe bench asktell`: the optimizer's own overhead per candidate in the ask/tell API.
//
// A swarm of P points in d = 2 is asked for N = P V candidates (simplex, V = 3) and told their
// losses on a shifted sphere. Only ask() and tell() are timed, not the objective: the result
// is what the optimizer adds to each candidate evaluation (rotations, displacements, the
// transport solve, the move). The target is under 1 microsecond per candidate at N = 1e5.
#include "bench.hpp"

#include <polyprobe/ask_tell.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace polyprobe::app {

namespace {

struct Variant {
  std::string name;
  OptimizerConfig config;
};

std::vector<Variant> variants() {
  std::vector<Variant> v(3);
  v[0].name = "sinkhorn";  // the default: Sinkhorn with warm-started duals
  v[1].name = "softmax";
  v[1].config.solver = TransportSolver::softmax;
  v[2].name = "trust_region";
  v[2].config.radius.kind = RadiusModelKind::trust_region;
  return v;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

std::vector<BenchRecord> run_asktell(Context& ctx) {
  const int repeats = ctx.vm.count("repeats") ? ctx.vm["repeats"].as<int>() : 7;
  std::vector<BenchRecord> records;
  for (int64_t target : {int64_t{1000}, int64_t{10000}, int64_t{100000}})
    for (const Variant& variant : variants()) {
      OptimizerConfig config = variant.config;
      config.particle_dim = 2;
      const int64_t particles = (target + 2) / 3;
      Matrix<double> start(particles, 2);
      for (int64_t i = 0; i < particles; ++i) {  // a spread-out swarm
        start(i, 0) = std::sin(0.37 * static_cast<double>(i)) * 3;
        start(i, 1) = std::cos(0.11 * static_cast<double>(i)) * 3;
      }
      AskTellOptimizer opt(start, config);
      std::vector<double> losses;
      using clock = std::chrono::steady_clock;
      auto one_step = [&]() {
        const auto t0 = clock::now();
        const Matrix<double>& asked = opt.ask();
        const auto t1 = clock::now();
        losses.resize(static_cast<std::size_t>(asked.rows()));
        for (Eigen::Index r = 0; r < asked.rows(); ++r)
          losses[static_cast<std::size_t>(r)] = (asked.row(r).array() - 0.5).square().sum();
        const auto t2 = clock::now();
        opt.tell(losses);
        const auto t3 = clock::now();
        return std::chrono::duration<double, std::milli>((t1 - t0) + (t3 - t2)).count();
      };
      Timing t;
      t.cold_ms = one_step();
      for (int i = 0; i < 3; ++i) one_step();  // warm-up: duals settle
      for (int i = 0; i < repeats; ++i) t.times_ms.push_back(one_step());
      t.reps = repeats;
      t.median_ms = quantile(t.times_ms, 0.5);
      t.iqr_ms = quantile(t.times_ms, 0.75) - quantile(t.times_ms, 0.25);
      t.min_ms = *std::min_element(t.times_ms.begin(), t.times_ms.end());
      t.max_ms = *std::max_element(t.times_ms.begin(), t.times_ms.end());
      BenchRecord r;
      r.suite = "asktell";
      r.workload = "swarm-d2-N" + std::to_string(static_cast<int64_t>(losses.size()));
      r.path = variant.name;
      r.dtype = "float64";
      r.candidates = static_cast<int64_t>(losses.size());
      r.timing = t;
      const double ns_per_candidate = 1e6 * t.median_ms / static_cast<double>(r.candidates);
      r.extra = {{"ns_per_candidate", ns_per_candidate},
                 {"particles", particles},
                 {"best_loss", opt.best_loss()}};
      records.push_back(r);
      if (!ctx.quiet)
        *ctx.err << "asktell " << r.workload << " " << variant.name << ": " << ns_per_candidate
                 << " ns per candidate (median)\n";
    }
  return records;
}

}  // namespace

BenchSuite asktell_bench_suite() {
  return {
      "asktell", "ask/tell overhead per candidate (swarm, d = 2, N up to 1e5), objective excluded",
      nullptr,   run_asktell,
      nullptr,   {"repeats"}};
}

}  // namespace polyprobe::app
