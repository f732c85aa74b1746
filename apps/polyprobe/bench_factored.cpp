// `polyprobe bench factored`: x B^T, a layer's input projected on its subspace directions,
// float32, one thread, at 64 and 512 samples of width 128 and 784 and 1 to 32 directions: the
// factored_correction operation (the factored_subspace plugin) called once for all the
// directions against one call per direction, which computes what an evaluator's own loop of
// matrix-vector products does (the operation's single-direction kernel, the same instruction
// set). It is the narrow figure behind the evaluators' choice (cpu_tbb projects a layer's
// directions with one call from 8 of them). Then, on --bench-device (cpu_tbb or cuda), whole
// candidate evaluations of mnist128-factored-r32 and wide-factored-r64 with the incumbent moved
// before every call (so every call recomputes the forward and x B^T), by an evaluator with the
// operation and one with it withheld, alternated call by call so that a noisy host weighs on
// both alike. scripts/bench-factored.sh times complete steps with and without it.
#include "bench.hpp"
#include "bench_workloads.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/operations.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <random>
#include <sstream>

namespace polyprobe::app {
namespace {

// Whole evaluations with the incumbent moved before each, with and without the operation.
void time_evaluations(Context& ctx, std::vector<BenchRecord>& records) {
  const std::string device = ctx.vm["bench-device"].as<std::string>();
  std::vector<std::filesystem::path> dirs;
  if (ctx.vm.count("plugin-dir"))
    for (const std::string& d : ctx.vm["plugin-dir"].as<std::vector<std::string>>())
      dirs.emplace_back(d);
  PluginRegistry withheld;
  withheld.withhold_operation(PP_OPERATION_FACTORED_CORRECTION);
  withheld.load_directories(PluginRegistry::search_path(dirs));
  const int reps = std::max(31, ctx.vm["repeats"].as<int>());
  for (const std::string name : {"mnist128-factored-r32", "wide-factored-r64"}) {
    Workload w = build_workload(find_workload(name), 0, &ctx.registry);
    EvaluatorRequest request;
    request.backend = device == "cuda" ? "cuda" : "cpu_tbb";
    request.device = device;
    request.options.dtype = DType::f32;
    request.options.threads = 1;
    request.subspace = w.subspace.get();
    std::unique_ptr<Evaluator> arms[2] = {ctx.registry.make_evaluator(*w.model, *w.loss, request),
                                          withheld.make_evaluator(*w.model, *w.loss, request)};
    std::vector<double> params(w.model->parameters().begin(), w.model->parameters().end());
    std::vector<double> losses[2];
    std::vector<double> times[2];
    for (int arm = 0; arm < 2; ++arm) {
      arms[arm]->register_batch(w.batch);
      losses[arm].resize(static_cast<std::size_t>(w.candidates()));
    }
    for (int call = 0; call < reps + 3; ++call) {
      params[static_cast<std::size_t>(call) % params.size()] += 1e-4;  // a new incumbent
      for (int arm = 0; arm < 2; ++arm) {
        const auto start = std::chrono::steady_clock::now();
        arms[arm]->evaluate(params, w.set(), losses[arm]);
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        if (call >= 3) times[arm].push_back(ms);  // the first three warm up
      }
    }
    double worst = 0;
    for (std::size_t c = 0; c < losses[0].size(); ++c)
      worst = std::max(
          worst, std::abs(losses[0][c] - losses[1][c]) / std::max(1e-300, std::abs(losses[1][c])));
    for (int arm = 0; arm < 2; ++arm) {
      BenchRecord r;
      r.suite = "factored";
      r.device = device;
      r.workload = name + " (" + device + "), evaluate after a move";
      r.path = arm == 0 ? "factored_correction" : "own products";
      r.candidates = w.candidates();
      r.batch = w.spec.batch;
      r.timing = timing_of(times[arm].front(), times[arm]);
      r.max_rel_diff = worst;
      r.extra["evaluator"] = arms[arm]->name();
      r.extra["subspace_projections"] = arms[arm]
                                            ->explain()
                                            .value("plugin", nlohmann::json::object())
                                            .value("subspace_projections", "");
      records.push_back(r);
    }
    const double with = records[records.size() - 2].timing.median_ms,
                 own = records.back().timing.median_ms;
    records[records.size() - 2].extra["speedup"] = own / with;
  }
}

std::vector<BenchRecord> run_factored(Context& ctx) {
  const OperationTable::Entry* op = ctx.registry.operations().find(
      PP_OPERATION_FACTORED_CORRECTION, PP_DEVICE_NAME_CPU, PP_DTYPE_F32);
  if (op == nullptr)
    throw Error(
        "bench factored: no CPU factored_correction operation is loaded (put the "
        "factored_subspace plugin on the plugin path; `polyprobe plugins` says why it is not)");
  const auto* table = static_cast<const pp_factored_correction_table*>(op->op->table);
  auto project = [&](pp_factored_project_args& a) {
    pp_error err{};
    if (table->project(&a, &err) != PP_OK)
      throw Error(std::string("bench factored: the operation failed: ") + err.message);
  };
  // Calls of microseconds: more of them than a step's --repeats, each record warmed 0.1 s.
  TimingOptions timing;
  timing.repeats = std::max(31, ctx.vm["repeats"].as<int>());
  timing.min_warmup_seconds = 0.1;
  std::vector<BenchRecord> records;
  std::mt19937_64 rng(17);
  std::normal_distribution<float> gauss;
  for (const int64_t samples : {int64_t{64}, int64_t{512}})
    for (const int64_t width : {int64_t{128}, int64_t{784}})
      for (const int64_t n : {1, 2, 3, 4, 8, 16, 32}) {
        std::vector<float> x(static_cast<std::size_t>(samples * width)),
            dirs(static_cast<std::size_t>(n * width)),
            one_call(static_cast<std::size_t>(n * samples)), per_direction(one_call.size());
        for (float& v : x) v = gauss(rng);
        for (float& v : dirs) v = gauss(rng);
        pp_factored_project_args a{};
        a.struct_size = sizeof(a);
        a.dtype = PP_DTYPE_F32;
        a.samples = samples;
        a.width = width;
        a.x = x.data();
        a.x_stride = width;
        a.dirs_stride = width;
        a.out_stride = samples;
        a.threads = 1;
        auto record = [&](const std::string& how, const std::function<void()>& call) {
          BenchRecord r;
          r.suite = "factored";
          r.workload = std::to_string(samples) + "x" + std::to_string(width) + ", " +
                       std::to_string(n) + (n == 1 ? " direction" : " directions");
          r.path = how;
          r.batch = samples;
          r.timing = time_calls(call, timing);
          r.extra["samples"] = samples;
          r.extra["width"] = width;
          r.extra["directions"] = n;
          records.push_back(r);
          return r.timing.median_ms;
        };
        const double each = record("one call per direction", [&] {
          a.n_dirs = 1;
          for (int64_t j = 0; j < n; ++j) {
            a.dirs = dirs.data() + j * width;
            a.out = per_direction.data() + j * samples;
            project(a);
          }
        });
        const double once = record("one call (" + op->provider + ")", [&] {
          a.n_dirs = n;
          a.dirs = dirs.data();
          a.out = one_call.data();
          project(a);
        });
        // Differences relative to |B_j| |x_b|, the size a float32 sum of width terms rounds at.
        auto norm = [&](const float* v) {
          double sq = 0;
          for (int64_t i = 0; i < width; ++i) sq += static_cast<double>(v[i]) * v[i];
          return std::sqrt(sq);
        };
        double worst = 0;
        for (int64_t j = 0; j < n; ++j)
          for (int64_t b = 0; b < samples; ++b) {
            const auto k = static_cast<std::size_t>(j * samples + b);
            worst =
                std::max(worst, std::abs(static_cast<double>(one_call[k]) - per_direction[k]) /
                                    (norm(dirs.data() + j * width) * norm(x.data() + b * width)));
          }
        records.back().max_rel_diff = worst;
        records.back().extra["speedup"] = each / once;
      }
  time_evaluations(ctx, records);
  return records;
}

}  // namespace

BenchSuite factored_suite() {
  BenchSuite s;
  s.name = "factored";
  s.summary =
      "x B^T for 1 to 32 subspace directions: the factored_correction operation in one call vs "
      "one call per direction (the products an evaluator loops over)";
  s.shared = {"repeats", "bench-device"};
  s.run = run_factored;
  s.table = [](std::ostream& out, const std::vector<BenchRecord>& records) {
    auto fixed = [](double value, int digits) {
      std::ostringstream text;
      text << std::fixed << std::setprecision(digits) << value;
      return text.str();
    };
    std::vector<std::vector<std::string>> rows;
    rows.reserve(records.size());
    for (const BenchRecord& r : records)
      rows.push_back({r.workload, r.path, fixed(1e3 * r.timing.cold_ms, 2),
                      fixed(1e3 * r.timing.median_ms, 2), fixed(1e3 * r.timing.iqr_ms, 2),
                      r.extra.contains("speedup") ? fixed(r.extra["speedup"].get<double>(), 2) : "",
                      r.extra.contains("speedup") ? [&] {
                        std::ostringstream d;
                        d << std::scientific << std::setprecision(1) << r.max_rel_diff;
                        return d.str();
                      }()
                                                  : ""});
    print_columns(out,
                  {"x [samples x width], B rows", "how", "cold us", "median us", "iqr us",
                   "speedup", "max rel diff"},
                  {false, false, true, true, true, true, true}, rows);
  };
  return s;
}

}  // namespace polyprobe::app
