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
#include <polyprobe/optimizer_options.hpp>

#ifndef POLYPROBE_HAVE_NLOPT
#define POLYPROBE_HAVE_NLOPT 0
#endif
#if POLYPROBE_HAVE_NLOPT
#include <nlopt.hpp>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <iomanip>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace polyprobe::app {

namespace {

constexpr int kMaxSimplexGradients = 500;
constexpr int kProfileBudgets[] = {10, 50, 100, 500};
constexpr double kTolerances[] = {1e-3, 1e-5};

// Best value so far after each evaluation; a budget is never exceeded.
struct History {
  std::vector<double> best;
  int64_t budget = 0;
  double nlopt_seconds = 0;  // NLopt's wall-clock cap for this run
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

// How a run ended: "budget" (spent or not startable), "converged" (the solver's own stopping
// rule), "maxtime" (NLopt's wall-clock cap), "hung" (abandoned by the watchdog, see run_nlopt),
// or "error".
struct Solver {
  std::string name;
  // `seed` picks the run of a randomized solver (--dfo-seeds); deterministic ones ignore it.
  std::function<std::string(const MghProblem&, History&, uint64_t seed)> run;
  bool randomized = false;
};

struct RunInfo {
  std::string stop;
  double ms = 0;
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
  // Softmax for one particle of d > 2; below that the automatic choice (Sinkhorn across the
  // particles, softmax when a problem of n = 2 leaves one).
  c.solver = particle_dim > 2 ? TransportSolver::softmax : TransportSolver::automatic;
  return c;
}

// polyprobe-tr-dn with a warmer transport (temperature 0.3 on the min-max scaled costs, so the
// barycentre follows the simplex gradient rather than the best vertex) and a quadratic-model
// step of up to 10 step radii: faster early progress on smooth problems, found by
// --dfo-config on the n >= 10 problems (docs/benchmarks.md).
OptimizerConfig polyprobe_trust_region_warm(int particle_dim) {
  OptimizerConfig c = polyprobe_trust_region(particle_dim);
  c.ent_epsilon = 0.3;
  c.radius.quadratic_max_scale = 10;
  return c;
}

// polyprobe-tr-dn with a learned metric (OptimizerConfig::metric = bfgs): the simplex is
// sheared by a quasi-Newton estimate of the inverse Hessian built from successive simplex
// gradients, so it follows curved valleys; the warmer transport (0.5) keeps the move close to
// the preconditioned gradient and steps of up to 50 step radii let the model take the long
// steps a good metric allows. Found with --dfo-config --dfo-seeds 5 on the n >= 10 problems
// (docs/benchmarks.md); it is the library's recommended_minimize_config().
OptimizerConfig polyprobe_trust_region_bfgs(int particle_dim) {
  return recommended_minimize_config(particle_dim);
}

std::string run_polyprobe(OptimizerConfig config, const MghProblem& p, History& h, uint64_t seed) {
  config.seed += seed;
  const Objective f = [&](std::span<const double> x) { return h.record(p.f(x)); };
  minimize(f, p.x0, h.budget, config);
  return "budget";
}

// The NLopt baselines. NLopt is optional (cmake/PolyprobeDependencies.cmake): without it they
// are not in the solver list, `all` runs the polyprobe solvers only and says so, and naming
// one is an error that names the missing package.
constexpr const char* kNloptSolvers[] = {"nlopt-bobyqa", "nlopt-newuoa", "nlopt-neldermead",
                                         "nlopt-sbplx", "nlopt-cobyla"};
constexpr const char* kNloptMissing =
    "this polyprobe was built without NLopt (install libnlopt-cxx-dev, then reconfigure and "
    "rebuild)";

// NLopt 2.7's COBYLA can loop forever inside its trust-region subproblem (trstlp) without
// evaluating f, so its maxtime never triggers (NLopt issues #118 and #370; five of these
// problems at n = 10 hit it). So every NLopt run has a watchdog: the run happens on its own
// thread, and if it outlives its cap by kNloptGraceSeconds it is abandoned with what it had
// recorded (stop = "hung"); the stuck thread is detached and keeps its core until the process
// exits, touching nothing shared (its next evaluation, if any, stops it).
constexpr double kNloptGraceSeconds = 5;

#if POLYPROBE_HAVE_NLOPT
// One NLopt run, its history in `h`. `abandoned` (under `lock`) makes every later evaluation
// stop the run: see run_nlopt.
std::string run_nlopt_unguarded(nlopt::algorithm algorithm, const MghProblem& p, History& h,
                                std::mutex& lock, const bool& abandoned) {
  nlopt::opt opt(algorithm, static_cast<unsigned>(p.n));
  struct Data {
    const MghProblem* problem;
    History* history;
    std::mutex* lock;
    const bool* abandoned;
  } data{&p, &h, &lock, &abandoned};
  opt.set_min_objective(
      [](unsigned n, const double* x, double*, void* raw) {
        auto* d = static_cast<Data*>(raw);
        const double f = d->problem->f(std::span<const double>(x, n));
        const std::lock_guard<std::mutex> guard(*d->lock);
        if (*d->abandoned || static_cast<int64_t>(d->history->best.size()) >= d->history->budget)
          throw nlopt::forced_stop();
        return d->history->record(f);
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
  opt.set_maxtime(h.nlopt_seconds);
  std::vector<double> x = p.x0;
  double f = 0;
  try {
    const nlopt::result result = opt.optimize(x, f);
    if (result == nlopt::MAXTIME_REACHED) return "maxtime";
    if (result == nlopt::MAXEVAL_REACHED) return "budget";
    return "converged";
  } catch (const nlopt::forced_stop&) {
    return "budget";
  } catch (const nlopt::roundoff_limited&) {
    return "converged";  // the history has what it found
  } catch (const std::exception&) {
    return "error";
  }
}

std::string run_nlopt(nlopt::algorithm algorithm, const MghProblem& p, History& h) {
  struct Shared {
    std::mutex lock;
    std::condition_variable finished;
    bool done = false, abandoned = false;
    MghProblem problem;
    History history;
    std::string stop;
  };
  auto shared = std::make_shared<Shared>();
  shared->problem = p;
  shared->history = h;
  std::thread run([shared, algorithm] {
    std::string stop = run_nlopt_unguarded(algorithm, shared->problem, shared->history,
                                           shared->lock, shared->abandoned);
    const std::lock_guard<std::mutex> guard(shared->lock);
    shared->stop = std::move(stop);
    shared->done = true;
    shared->finished.notify_all();
  });
  std::unique_lock<std::mutex> guard(shared->lock);
  const bool done = shared->finished.wait_for(
      guard, std::chrono::duration<double>(h.nlopt_seconds + kNloptGraceSeconds),
      [&] { return shared->done; });
  h.best = shared->history.best;
  if (!done) {
    shared->abandoned = true;
    guard.unlock();
    run.detach();
    return "hung";
  }
  guard.unlock();
  run.join();
  return shared->stop;
}
#endif  // POLYPROBE_HAVE_NLOPT

// --dfo-config "key=value,...": overrides applied to the polyprobe-custom solver, which starts
// from polyprobe-tr-dn. The keys are the option table's (optimizer_options.hpp; its aliases
// d, K and radius, and '_' for '-', keep older command lines working); d=n means
// particle_dim = the problem's dimension. A particle_dim of 2 or less without an explicit
// solver goes back to the automatic solver, as polyprobe-tr-d2 has it.
struct CustomConfig {
  std::vector<std::pair<std::string, std::string>> overrides;
  OptimizerConfig for_dimension(int n) const;
};

CustomConfig parse_custom_config(const std::string& text);

std::vector<Solver> solvers(const CustomConfig& custom = {}) {
  using ConfigFor = std::function<OptimizerConfig(int n)>;  // the configuration for dimension n
  const std::pair<const char*, ConfigFor> polyprobe[] = {
      {"polyprobe-default", [](int) { return polyprobe_default(); }},
      {"polyprobe-tr-d2", [](int) { return polyprobe_trust_region(2); }},
      {"polyprobe-tr-dn", polyprobe_trust_region},
      {"polyprobe-tr-dn-warm", polyprobe_trust_region_warm},
      {"polyprobe-tr-dn-bfgs", polyprobe_trust_region_bfgs},
      {"polyprobe-custom", [custom](int n) { return custom.for_dimension(n); }}};
  std::vector<Solver> s;
  for (const auto& [name, config_for] : polyprobe)
    s.push_back({name,
                 [config_for = config_for](const MghProblem& p, History& h, uint64_t seed) {
                   return run_polyprobe(config_for(p.n), p, h, seed);
                 },
                 true});
#if POLYPROBE_HAVE_NLOPT
  for (auto [name, algorithm] :
       {std::pair{"nlopt-bobyqa", nlopt::LN_BOBYQA}, std::pair{"nlopt-newuoa", nlopt::LN_NEWUOA},
        std::pair{"nlopt-neldermead", nlopt::LN_NELDERMEAD},
        std::pair{"nlopt-sbplx", nlopt::LN_SBPLX}, std::pair{"nlopt-cobyla", nlopt::LN_COBYLA}})
    s.push_back({name, [algorithm = algorithm](const MghProblem& p, History& h, uint64_t) {
                   return run_nlopt(algorithm, p, h);
                 }});
#endif
  return s;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start) items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

OptimizerConfig CustomConfig::for_dimension(int n) const {
  OptimizerSettings settings;
  settings.optimizer = polyprobe_trust_region(n);
  for (const auto& [key, value] : overrides) {
    // d=n: the problem's dimension, one particle of every coordinate.
    const bool whole = value == "n" && find_option(key) == find_option("particle-dim");
    set_option(settings, key, whole ? std::to_string(n) : value);
    if (find_option(key) == find_option("particle-dim") && settings.optimizer.particle_dim <= 2 &&
        settings.optimizer.solver == TransportSolver::softmax && !settings.given.contains("solver"))
      settings.optimizer.solver = TransportSolver::automatic;
  }
  validate_settings(settings, OptionScope::minimize);
  return settings.optimizer;
}

CustomConfig parse_custom_config(const std::string& text) {
  CustomConfig custom;
  for (const std::string& item : split_list(text)) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--dfo-config: expected key=value, got '" + item + "'");
    custom.overrides.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  try {
    (void)custom.for_dimension(10);
  } catch (const std::exception& e) {
    throw UsageError(std::string("--dfo-config: ") + e.what());
  }
  return custom;
}

std::string problem_id(const MghProblem& p) { return p.name + "-" + std::to_string(p.n); }

// The solvers named by --dfo-solvers ("all" or a comma-separated list).
std::vector<Solver> select_solvers(const std::string& list, const CustomConfig& custom) {
  std::vector<Solver> all = solvers(custom);
  if (list == "all") {
    // polyprobe-custom is polyprobe-tr-dn unless --dfo-config changes it.
    if (custom.overrides.empty())
      std::erase_if(all, [](const Solver& s) { return s.name == "polyprobe-custom"; });
    return all;
  }
  std::vector<Solver> chosen;
  for (const std::string& name : split_list(list)) {
    auto it = std::find_if(all.begin(), all.end(), [&](const Solver& s) { return s.name == name; });
    if (it == all.end() && !POLYPROBE_HAVE_NLOPT &&
        std::any_of(std::begin(kNloptSolvers), std::end(kNloptSolvers),
                    [&](const char* nlopt) { return name == nlopt; }))
      throw Error("--dfo-solvers: " + name + " is an NLopt baseline, but " + kNloptMissing);
    if (it == all.end()) {
      std::string known;
      for (const Solver& s : all) known += (known.empty() ? "" : ", ") + s.name;
      throw UsageError("--dfo-solvers: unknown solver '" + name + "' (solvers: " + known + ")");
    }
    if (std::none_of(chosen.begin(), chosen.end(), [&](const Solver& s) { return s.name == name; }))
      chosen.push_back(*it);
  }
  if (chosen.empty()) throw UsageError("--dfo-solvers: no solver named");
  return chosen;
}

// The problems named by --dfo-problems ("all", or names like "rosenbrock" for every dimension
// or "rosenbrock-30" for one) within [--dfo-min-n, --dfo-max-n].
std::vector<MghProblem> select_problems(const std::string& list, int min_n, int max_n) {
  std::vector<MghProblem> all = mgh_problems();
  std::vector<std::string> names;
  if (list != "all") names = split_list(list);
  for (const std::string& name : names)
    if (std::none_of(all.begin(), all.end(), [&](const MghProblem& p) {
          return p.name == name || problem_id(p) == name;
        })) {
      std::string known;
      for (const MghProblem& p : all) known += (known.empty() ? "" : ", ") + problem_id(p);
      throw UsageError("--dfo-problems: unknown problem '" + name + "' (problems: " + known + ")");
    }
  std::vector<MghProblem> chosen;
  for (MghProblem& p : all) {
    if (p.n < min_n || p.n > max_n) continue;
    if (!names.empty() && std::none_of(names.begin(), names.end(), [&](const std::string& name) {
          return p.name == name || problem_id(p) == name;
        }))
      continue;
    chosen.push_back(std::move(p));
  }
  if (chosen.empty()) throw UsageError("--dfo-problems/--dfo-min-n/--dfo-max-n select no problem");
  return chosen;
}

// f_L from a previous `bench dfo --json` file: the best value of every run it holds, per
// problem ("workload"), so that a subset of solvers is judged against the complete set.
std::map<std::string, double> read_reference_best(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw UsageError("--dfo-reference: cannot read '" + path + "'");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(file);
  } catch (const std::exception& e) {
    throw UsageError("--dfo-reference: '" + path + "' is not JSON: " + e.what());
  }
  std::map<std::string, double> best;
  if (!doc.contains("records")) throw UsageError("--dfo-reference: no records in '" + path + "'");
  for (const auto& r : doc["records"]) {
    if (r.value("suite", "") != "dfo" || !r.contains("best") || !r["best"].is_number()) continue;
    const std::string id = r.value("workload", "");
    const double value = r["best"].get<double>();
    auto [it, added] = best.emplace(id, value);
    if (!added) it->second = std::min(it->second, value);
  }
  return best;
}

struct Progress {
  Progress(bool on, std::ostream& stream) : enabled(on), err(stream) {}
  bool enabled;
  std::ostream& err;
  std::mutex mutex;
  std::size_t done = 0, total = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  void finished(const std::string& what) {
    if (!enabled) return;
    std::lock_guard lock(mutex);
    ++done;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    err << "\r\033[K[dfo] " << done << "/" << total << " runs, " << std::fixed
        << std::setprecision(0) << s << " s, last: " << what << std::defaultfloat << std::flush;
    if (done == total) err << "\n";
  }
};

std::vector<BenchRecord> run_dfo(Context& ctx) {
  const auto& vm = ctx.vm;
  const std::vector<MghProblem> problems = select_problems(
      vm["dfo-problems"].as<std::string>(), vm["dfo-min-n"].as<int>(), vm["dfo-max-n"].as<int>());
  const std::vector<Solver> all = select_solvers(
      vm["dfo-solvers"].as<std::string>(), parse_custom_config(vm["dfo-config"].as<std::string>()));
  const double nlopt_seconds = vm["dfo-nlopt-seconds"].as<double>();
  if (!(nlopt_seconds > 0)) throw UsageError("--dfo-nlopt-seconds must be positive");
  int threads = vm["dfo-threads"].as<int>();
  if (threads < 0) throw UsageError("--dfo-threads must be 0 (all cores) or positive");
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::map<std::string, double> reference;
  const bool has_reference = vm.count("dfo-reference") > 0;
  if (has_reference) reference = read_reference_best(vm["dfo-reference"].as<std::string>());
  const int seeds = vm["dfo-seeds"].as<int>();
  if (seeds < 1) throw UsageError("--dfo-seeds must be at least 1");
  // A randomized solver runs once per seed 0 .. seeds - 1, a deterministic one once.
  auto runs_of = [&](std::size_t s) { return all[s].randomized ? seeds : 1; };

  // histories[solver][problem][seed], runs likewise.
  std::vector<std::vector<std::vector<History>>> histories(all.size());
  std::vector<std::vector<std::vector<RunInfo>>> runs(all.size());
  for (std::size_t s = 0; s < all.size(); ++s) {
    histories[s].assign(problems.size(), std::vector<History>(runs_of(s)));
    runs[s].assign(problems.size(), std::vector<RunInfo>(runs_of(s)));
  }
  // Every (problem, solver, seed) run is independent: spread them over the cores, the largest
  // problems first so that the long runs do not end up last. Histories are per run, so the
  // results do not depend on the thread count (NLopt's wall-clock cap aside).
  struct Task {
    std::size_t problem, solver;
    int seed;
  };
  std::vector<Task> tasks;
  for (std::size_t p = 0; p < problems.size(); ++p)
    for (std::size_t s = 0; s < all.size(); ++s)
      for (int r = 0; r < runs_of(s); ++r) tasks.push_back({p, s, r});
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& a, const Task& b) {
    return problems[a.problem].n > problems[b.problem].n;
  });
  Progress progress{!ctx.quiet, *ctx.err};
  progress.total = tasks.size();
  std::atomic<std::size_t> next{0};
  auto worker = [&]() {
    for (std::size_t task; (task = next++) < tasks.size();) {
      const auto [p, s, r] = tasks[task];
      History& h = histories[s][p][static_cast<std::size_t>(r)];
      RunInfo& run = runs[s][p][static_cast<std::size_t>(r)];
      h.budget = int64_t{kMaxSimplexGradients} * (problems[p].n + 1);
      h.nlopt_seconds = nlopt_seconds;
      const auto t0 = std::chrono::steady_clock::now();
      run.stop = all[s].run(problems[p], h, static_cast<uint64_t>(r));
      run.ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      progress.finished(problem_id(problems[p]) + " " + all[s].name);
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();

  // f_L per problem: the best value of the solvers run here and of the reference file.
  std::vector<double> f_low(problems.size(), std::numeric_limits<double>::infinity());
  std::vector<double> f_start(problems.size());
  for (std::size_t p = 0; p < problems.size(); ++p) {
    f_start[p] = problems[p].f(problems[p].x0);
    for (const auto& per_solver : histories)
      for (const History& h : per_solver[p]) f_low[p] = std::min(f_low[p], h.best_within(h.budget));
    if (auto it = reference.find(problem_id(problems[p])); it != reference.end())
      f_low[p] = std::min(f_low[p], it->second);
  }

  std::vector<BenchRecord> records;
  for (std::size_t p = 0; p < problems.size(); ++p)
    for (std::size_t s = 0; s < all.size(); ++s)
      for (int seed = 0; seed < runs_of(s); ++seed) {
        const MghProblem& problem = problems[p];
        const History& h = histories[s][p][static_cast<std::size_t>(seed)];
        const RunInfo& run = runs[s][p][static_cast<std::size_t>(seed)];
        BenchRecord r;
        r.suite = "dfo";
        r.workload = problem_id(problem);
        r.path = all[s].name;
        r.dtype = "float64";
        r.candidates = static_cast<int64_t>(h.best.size());
        r.timing.cold_ms = r.timing.median_ms = r.timing.min_ms = r.timing.max_ms = run.ms;
        r.timing.reps = 1;
        r.extra = {{"n", problem.n},    {"f0", f_start[p]},   {"best", h.best_within(h.budget)},
                   {"f_low", f_low[p]}, {"budget", h.budget}, {"evaluations", h.best.size()},
                   {"stop", run.stop}};
        if (all[s].randomized) r.extra["seed"] = seed;
        // Where the convergence test was first met, in simplex gradients (null: never), so a
        // profile can be read problem by problem.
        nlohmann::json solved_at = nlohmann::json::object();
        for (double tau : kTolerances) {
          const auto first = std::find_if(h.best.begin(), h.best.end(), [&](double f) {
            return f_start[p] - f >= (1 - tau) * (f_start[p] - f_low[p]);
          });
          solved_at[tau == 1e-3 ? "1e-3" : "1e-5"] =
              first == h.best.end()
                  ? nlohmann::json()
                  : nlohmann::json(static_cast<double>(first - h.best.begin() + 1) /
                                   (problem.n + 1));
        }
        r.extra["solved_at_sg"] = solved_at;
        records.push_back(r);
      }

  // Data profiles: fraction of problems solved within k simplex gradients.
  std::ostream& out = *ctx.out;
  out << "\n"
      << problems.size() << " problems, " << all.size() << " solvers"
      << (seeds > 1 ? ", randomized ones " + std::to_string(seeds) + " seeds each (profiles: mean)"
                    : std::string())
      << "; f_L from "
      << (has_reference ? "these solvers and " + vm["dfo-reference"].as<std::string>()
                        : std::string("these solvers only"))
      << "\n";
  if (!POLYPROBE_HAVE_NLOPT && vm["dfo-solvers"].as<std::string>() == "all")
    out << "NLopt baselines unavailable: " << kNloptMissing << "; ran the polyprobe solvers only\n";
  int capped = 0, hung = 0;
  for (const auto& per_solver : runs)
    for (const auto& per_problem : per_solver)
      for (const RunInfo& run : per_problem) {
        capped += run.stop == "maxtime" ? 1 : 0;
        hung += run.stop == "hung" ? 1 : 0;
      }
  if (capped > 0)
    out << capped << " NLopt run(s) stopped at the " << nlopt_seconds
        << " s wall-clock cap before spending their budget\n";
  if (hung > 0)
    out << hung << " NLopt run(s) hung inside the solver (COBYLA's trstlp, NLopt issue #370) and "
        << "were abandoned " << kNloptGraceSeconds << " s after the cap, keeping what they had "
        << "found\n";
  for (const char* group : {"all", "n>=10"}) {
    int counted = 0;
    for (const MghProblem& p : problems) counted += std::string(group) == "all" || p.n >= 10;
    // Nothing to count, or "all" holds only problems with n >= 10 (printed as that group).
    const bool all_large = std::all_of(problems.begin(), problems.end(),
                                       [](const MghProblem& p) { return p.n >= 10; });
    if (counted == 0 || (std::string(group) == "all" && all_large)) continue;
    for (double tau : kTolerances) {
      out << "\ndata profile, tau = " << tau << ", problems: " << group << " (" << counted << ")\n";
      out << std::left << std::setw(24) << "solver";
      for (int k : kProfileBudgets) out << std::right << std::setw(9) << (std::to_string(k) + "sg");
      out << "\n";
      for (std::size_t s = 0; s < all.size(); ++s) {
        out << std::left << std::setw(24) << all[s].name;
        nlohmann::json row = nlohmann::json::object();
        for (int k : kProfileBudgets) {
          // A randomized solver's fraction is the mean over its seeds.
          int solved = 0;
          for (std::size_t p = 0; p < problems.size(); ++p) {
            if (std::string(group) == "n>=10" && problems[p].n < 10) continue;
            for (const History& h : histories[s][p]) {
              const double f = h.best_within(int64_t{k} * (problems[p].n + 1));
              if (f_start[p] - f >= (1 - tau) * (f_start[p] - f_low[p])) ++solved;
            }
          }
          const double fraction = static_cast<double>(solved) / (counted * runs_of(s));
          out << std::right << std::setw(9) << std::fixed << std::setprecision(2) << fraction
              << std::defaultfloat;
          row[std::to_string(k)] = fraction;
        }
        out << "\n";
        BenchRecord r;
        r.suite = "dfo";
        r.workload = std::string("profile ") + group + " tau=" + (tau == 1e-3 ? "1e-3" : "1e-5");
        r.path = all[s].name;
        r.extra = {{"profile", row},
                   {"tau", tau},
                   {"group", group},
                   {"problems", counted},
                   {"seeds", runs_of(s)},
                   {"f_low_source", has_reference ? "solvers run and reference" : "solvers run"}};
        records.push_back(r);
      }
    }
  }
  out << "\n";
  return records;
}

void dfo_options(po::options_description& o) {
  o.add_options()("dfo-solvers", po::value<std::string>()->default_value("all"),
                  "dfo: comma-separated solvers (polyprobe-tr-dn, nlopt-sbplx, ...) or all")(
      "dfo-problems", po::value<std::string>()->default_value("all"),
      "dfo: comma-separated problems, by name (every dimension) or name-n, or all")(
      "dfo-min-n", po::value<int>()->default_value(2), "dfo: smallest dimension to run")(
      "dfo-max-n", po::value<int>()->default_value(100), "dfo: largest dimension to run")(
      "dfo-nlopt-seconds", number_value(45),
      "dfo: wall-clock cap of one NLopt run (a capped run has not spent its budget)")(
      "dfo-threads", po::value<int>()->default_value(0),
      "dfo: runs in parallel (0: one per hardware thread)")(
      "dfo-config", po::value<std::string>()->default_value(""),
      "dfo: key=value overrides of polyprobe-tr-dn for the polyprobe-custom solver: the "
      "optimizer options of `polyprobe train --help` and the trust-region ones "
      "(docs/training.md lists them all; '_' for '-' works, d=n is the problem's dimension), "
      "e.g. d=n,metric=bfgs,ent-epsilon=0.5")(
      "dfo-seeds", po::value<int>()->default_value(1),
      "dfo: runs of each randomized (polyprobe) solver, seeds 0 .. N-1; its profile is the mean "
      "over them")(
      "dfo-reference", po::value<std::string>()->value_name("FILE"),
      "dfo: a previous `bench dfo --json` file whose best values also count towards f_L");
}

// The closing table: one row per run (the profiles were printed above), with what it found.
void print_runs(std::ostream& out, const std::vector<BenchRecord>& records) {
  const auto number = [](const nlohmann::json& value) {
    if (!value.is_number()) return std::string("-");
    std::ostringstream s;
    s << std::setprecision(4) << value.get<double>();
    return s.str();
  };
  std::vector<std::vector<std::string>> rows;
  for (const BenchRecord& r : records) {
    if (!r.extra.contains("best")) continue;  // a data profile
    const nlohmann::json& solved = r.extra["solved_at_sg"];
    std::ostringstream ms;
    ms << std::fixed << std::setprecision(1) << r.timing.cold_ms;
    rows.push_back({r.workload, r.path, r.extra.contains("seed") ? r.extra["seed"].dump() : "-",
                    std::to_string(r.candidates), number(r.extra["f0"]), number(r.extra["best"]),
                    number(r.extra["f_low"]), number(solved.value("1e-3", nlohmann::json())),
                    number(solved.value("1e-5", nlohmann::json())),
                    r.extra.value("stop", std::string()), ms.str()});
  }
  out << "runs (solved at: simplex gradients until the convergence test held, - never)\n";
  print_columns(out,
                {"problem", "solver", "seed", "evaluations", "f0", "best", "f_L", "solved at 1e-3",
                 "solved at 1e-5", "stop", "ms"},
                {false, false, true, true, true, true, true, true, true, false, true}, rows);
}

}  // namespace

BenchSuite dfo_bench_suite() {
  return {"dfo",
          "Moré–Garbow–Hillstrom problems (n = 2..100): polyprobe vs NLopt at equal budgets, as "
          "data profiles",
          dfo_options, run_dfo, print_runs};
}

}  // namespace polyprobe::app
