// `polyprobe bench dfo`: the polytope optimizer against NLopt's derivative-free solvers on the
// Moré–Garbow–Hillstrom problems, reported as Moré–Wild data profiles.
//
// Every solver gets the same evaluation budget, 500 simplex gradients ((n + 1) * 500
// evaluations); the best value after each evaluation is recorded, so one run gives the
// profile at every smaller budget too (every configuration here is budget-independent). A
// problem counts as solved at tolerance tau by a solver once f(x0) - f(x) >= (1 - tau)
// (f(x0) - f_L), f_L the best value any solver found (Moré and Wild, 2009).
#include "bench.hpp"
#include "mgh_problems.hpp"

#include <polyprobe/minimize.hpp>

#include <nlopt.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <limits>
#include <thread>

namespace polyprobe::app {

namespace {

constexpr int kMaxSimplexGradients = 500;
constexpr int kProfileBudgets[] = {10, 50, 100, 500};
constexpr double kTolerances[] = {1e-3, 1e-5};
constexpr double kNloptMaxSeconds = 120;

// Best value so far after each evaluation; a budget is never exceeded.
struct History {
  std::vector<double> best;
  int64_t budget = 0;
  double record(double f) {
    const double prev = best.empty() ? std::numeric_limits<double>::infinity() : best.back();
    best.push_back(std::isfinite(f) ? std::min(prev, f) : prev);
    return f;
  }
  double best_within(int64_t evaluations) const {
    if (best.empty() || evaluations <= 0) return std::numeric_limits<double>::infinity();
    return best[static_cast<std::size_t>(
        std::min<int64_t>(evaluations, static_cast<int64_t>(best.size())) - 1)];
  }
};

struct Solver {
  std::string name;
  std::function<void(const MghProblem&, History&)> run;
};

// polyprobe configurations, each independent of the budget (no schedule over total_steps).
OptimizerConfig polyprobe_default() { return OptimizerConfig{}; }

// polystep's best configuration at a fixed budget (simplex + quadratic model + trust region,
// K = 1), with the probe radius following the trust radius so it can resolve small scales.
OptimizerConfig polyprobe_trust_region(int particle_dim) {
  OptimizerConfig c;
  c.particle_dim = particle_dim;
  c.radius.kind = RadiusModelKind::trust_region;
  c.radius.trust_scales_probe = true;
  c.radius.trust_min = 1e-9;
  c.radius.trust_max = 100;
  c.cost_scaling = CostScaling::min_max;
  c.solver = particle_dim > 2 ? TransportSolver::softmax : TransportSolver::sinkhorn;
  return c;
}

void run_polyprobe(const OptimizerConfig& config, const MghProblem& p, History& h) {
  const Objective f = [&](std::span<const double> x) { return h.record(p.f(x)); };
  minimize(f, p.x0, h.budget, config);
}

void run_nlopt(nlopt::algorithm algorithm, const MghProblem& p, History& h) {
  nlopt::opt opt(algorithm, static_cast<unsigned>(p.n));
  struct Data {
    const MghProblem* problem;
    History* history;
  } data{&p, &h};
  opt.set_min_objective(
      [](unsigned n, const double* x, double*, void* raw) {
        auto* d = static_cast<Data*>(raw);
        if (static_cast<int64_t>(d->history->best.size()) >= d->history->budget)
          throw nlopt::forced_stop();
        return d->history->record(d->problem->f(std::span<const double>(x, n)));
      },
      &data);
  opt.set_maxeval(static_cast<int>(h.budget));
  // The same initial-step rule for every NLopt solver: a tenth of each coordinate's scale.
  std::vector<double> step(static_cast<std::size_t>(p.n));
  for (int i = 0; i < p.n; ++i)
    step[static_cast<std::size_t>(i)] =
        0.1 * std::max(1.0, std::abs(p.x0[static_cast<std::size_t>(i)]));
  opt.set_initial_step(step);
  // NLopt's COBYLA needs many minutes for 500 (n + 1) evaluations at n >= 50; a wall-clock cap
  // keeps the suite finite. A run it stops has simply not used the rest of its budget.
  opt.set_maxtime(kNloptMaxSeconds);
  std::vector<double> x = p.x0;
  double f = 0;
  try {
    opt.optimize(x, f);
  } catch (const std::exception&) {
    // forced_stop at the budget, or a roundoff-limited exit: the history has what it found.
  }
}

std::vector<Solver> solvers() {
  std::vector<Solver> s;
  s.push_back({"polyprobe-default",
               [](const MghProblem& p, History& h) { run_polyprobe(polyprobe_default(), p, h); }});
  s.push_back({"polyprobe-tr-d2", [](const MghProblem& p, History& h) {
                 run_polyprobe(polyprobe_trust_region(2), p, h);
               }});
  s.push_back({"polyprobe-tr-dn", [](const MghProblem& p, History& h) {
                 run_polyprobe(polyprobe_trust_region(p.n), p, h);
               }});
  for (auto [name, algorithm] :
       {std::pair{"nlopt-bobyqa", nlopt::LN_BOBYQA}, std::pair{"nlopt-newuoa", nlopt::LN_NEWUOA},
        std::pair{"nlopt-neldermead", nlopt::LN_NELDERMEAD},
        std::pair{"nlopt-sbplx", nlopt::LN_SBPLX}, std::pair{"nlopt-cobyla", nlopt::LN_COBYLA}})
    s.push_back({name, [algorithm = algorithm](const MghProblem& p, History& h) {
                   run_nlopt(algorithm, p, h);
                 }});
  return s;
}

std::vector<BenchRecord> run_dfo(Context& ctx) {
  const std::vector<MghProblem> problems = mgh_problems();
  const std::vector<Solver> all = solvers();
  // histories[solver][problem]
  std::vector<std::vector<History>> histories(all.size(), std::vector<History>(problems.size()));
  // Every (problem, solver) run is independent: spread them over the cores. Histories are
  // per run, so the results do not depend on the thread count.
  std::vector<std::vector<double>> run_ms(all.size(), std::vector<double>(problems.size()));
  std::atomic<std::size_t> next{0};
  auto worker = [&]() {
    for (std::size_t task; (task = next++) < problems.size() * all.size();) {
      const std::size_t p = task / all.size(), s = task % all.size();
      History& h = histories[s][p];
      h.budget = int64_t{kMaxSimplexGradients} * (problems[p].n + 1);
      const auto t0 = std::chrono::steady_clock::now();
      all[s].run(problems[p], h);
      run_ms[s][p] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::max(1u, std::thread::hardware_concurrency()); ++t)
    threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();

  std::vector<BenchRecord> records;
  for (std::size_t p = 0; p < problems.size(); ++p)
    for (std::size_t s = 0; s < all.size(); ++s) {
      const MghProblem& problem = problems[p];
      const History& h = histories[s][p];
      BenchRecord r;
      r.suite = "dfo";
      r.workload = problem.name + "-" + std::to_string(problem.n);
      r.path = all[s].name;
      r.dtype = "float64";
      r.candidates = static_cast<int64_t>(h.best.size());
      r.timing.cold_ms = r.timing.median_ms = r.timing.min_ms = r.timing.max_ms = run_ms[s][p];
      r.timing.reps = 1;
      r.extra = {{"n", problem.n},
                 {"f0", problem.f(problem.x0)},
                 {"best", h.best_within(h.budget)},
                 {"evaluations", h.best.size()}};
      records.push_back(r);
    }

  // Data profiles: fraction of problems solved within k simplex gradients.
  std::ostream& out = *ctx.out;
  for (const char* group : {"all", "n>=10"}) {
    for (double tau : kTolerances) {
      out << "\ndata profile, tau = " << tau << ", problems: " << group << "\n";
      out << std::left << std::setw(20) << "solver";
      for (int k : kProfileBudgets) out << std::right << std::setw(9) << (std::to_string(k) + "sg");
      out << "\n";
      for (std::size_t s = 0; s < all.size(); ++s) {
        out << std::left << std::setw(20) << all[s].name;
        nlohmann::json row = nlohmann::json::object();
        for (int k : kProfileBudgets) {
          int solved = 0, counted = 0;
          for (std::size_t p = 0; p < problems.size(); ++p) {
            if (std::string(group) == "n>=10" && problems[p].n < 10) continue;
            ++counted;
            const double f0 = problems[p].f(problems[p].x0);
            double f_best = std::numeric_limits<double>::infinity();
            for (const auto& per_solver : histories)
              f_best = std::min(f_best, per_solver[p].best_within(per_solver[p].budget));
            const double f = histories[s][p].best_within(int64_t{k} * (problems[p].n + 1));
            if (f0 - f >= (1 - tau) * (f0 - f_best)) ++solved;
          }
          const double fraction = counted > 0 ? static_cast<double>(solved) / counted : 0.0;
          out << std::right << std::setw(9) << std::fixed << std::setprecision(2) << fraction
              << std::defaultfloat;
          row[std::to_string(k)] = fraction;
        }
        out << "\n";
        BenchRecord r;
        r.suite = "dfo";
        r.workload = std::string("profile ") + group + " tau=" + (tau == 1e-3 ? "1e-3" : "1e-5");
        r.path = all[s].name;
        r.extra = {{"profile", row}, {"tau", tau}, {"group", group}};
        records.push_back(r);
      }
    }
  }
  out << "\n";
  return records;
}

}  // namespace

BenchSuite dfo_bench_suite() {
  return {"dfo",
          "Moré–Garbow–Hillstrom problems (n = 2..100): polyprobe vs NLopt at equal budgets, as "
          "data profiles",
          nullptr, run_dfo};
}

}  // namespace polyprobe::app
