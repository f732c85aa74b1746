// `polyprobe bench step`: one optimizer step's candidate evaluation on the reference
// workloads (bench_workloads.hpp), timed as the PyTorch reference times it (displacements,
// incumbent forward and every candidate loss inside the call), with the float64 reference
// evaluator's losses on a random sample of candidates as the parity check. `forward`
// (bench_forward.cpp) shares the options registered here.
#include "bench.hpp"
#include "bench_workloads.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/optimizer.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <sys/resource.h>
#include <time.h>

namespace polyprobe::app {
namespace {

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

// The numbers to beat (bench/README.md, same machine): the PyTorch reference's best method
// at 1 thread and at 2 cores, and the seed implementation at 1 thread.
struct Baseline {
  double torch_1, torch_all, seed_1;
};
const std::map<std::string, Baseline>& baselines() {
  static const std::map<std::string, Baseline> b = {
      {"mlp64-full", {8.53, 5.98, 40.91}},    {"mlp256-full", {95.2, 60.2, 736.17}},
      {"mlp256-sub512", {2.98, 2.05, 28.27}}, {"mnist128-sub256", {1.06, 0.943, 0}},
      {"mnist64-full", {27.9, 15.9, 0}},
  };
  return b;
}

// The host's peak resident set so far, in bytes (Linux reports KiB).
double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return 1024.0 * static_cast<double>(usage.ru_maxrss);
}

// How complete steps are configured: at the reference's radius (probe displacement
// 0.5 x 1e-2, the radius model fixed) and at `polyprobe train`'s defaults (step and probe
// radius 2, epsilon 0.3: displacement 0.3, the quadratic radius model, which scores the
// incumbent with the candidates). The schedule is held constant so every timed step is alike.
struct StepRegime {
  const char* name;
  double step_radius, probe_radius, epsilon;
  RadiusModelKind radius;
};
constexpr StepRegime kRegimes[] = {
    {"step@reference", 1e-2, 1e-2, 1.0, RadiusModelKind::fixed},
    {"step@train", 2.0, 2.0, 0.3, RadiusModelKind::quadratic},
};

std::vector<std::string> regime_names(const Context& ctx) {
  std::vector<std::string> names = split(ctx.vm["regimes"].as<std::string>());
  for (const std::string& n : names) {
    bool known = n == "evaluation";
    for (const StepRegime& r : kRegimes) known = known || n == r.name;
    if (!known)
      throw UsageError("--regimes: unknown regime '" + n +
                       "' (evaluation, step@reference, step@train)");
  }
  return names;
}

// The evaluator a step record times: the bench's backend on `device`, float32 candidates.
EvaluatorRequest step_request(const Context& ctx, const Workload& w, const std::string& device,
                              int threads, const std::string& path = "",
                              CandidateDType candidates = CandidateDType::compute) {
  EvaluatorRequest request;
  request.backend = ctx.vm["bench-backend"].as<std::string>();
  request.device = device;
  request.options.dtype = DType::f32;
  request.options.candidate_dtype = candidates;
  request.options.threads = threads;
  request.subspace = w.subspace.get();
  request.path = path == "auto" ? "" : path;
  return request;
}

// --candidate-dtypes: float32 ("same") and any reduced ones, timed side by side.
std::vector<CandidateDType> candidate_dtypes(const Context& ctx) {
  std::vector<CandidateDType> dtypes;
  for (const std::string& name : split(ctx.vm["candidate-dtypes"].as<std::string>())) {
    try {
      dtypes.push_back(parse_candidate_dtype(name));
    } catch (const Error& e) {
      throw UsageError(std::string("--candidate-dtypes: ") + e.what());
    }
  }
  if (dtypes.empty()) throw UsageError("--candidate-dtypes: name at least one (same, bf16, fp16)");
  return dtypes;
}

// "" for float32 candidates, else "+bf16" or "+fp16": appended to a record's path.
std::string dtype_suffix(CandidateDType dtype) {
  return dtype == CandidateDType::compute ? "" : "+" + std::string(to_string(dtype));
}

// The median of the timed calls' thread CPU times (the last `reps` of `cpu_ms`).
double timed_median(const std::vector<double>& cpu_ms, int reps) {
  std::vector<double> timed(cpu_ms.end() - reps, cpu_ms.end());
  std::sort(timed.begin(), timed.end());
  return timed[timed.size() / 2];
}

}  // namespace

std::vector<int> bench_thread_counts(const Context& ctx) {
  std::vector<int> counts;
  for (const std::string& t : split(ctx.vm["bench-threads"].as<std::string>())) {
    if (t == "all")
      counts.push_back(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    else
      counts.push_back(std::stoi(t));
  }
  return counts;
}

std::vector<std::string> bench_workload_names(const Context& ctx) {
  const std::string list = ctx.vm["workloads"].as<std::string>();
  std::vector<std::string> names;
  if (list == "all") {
    for (const WorkloadSpec& s : reference_workloads())
      if (!s.named_only) names.push_back(s.name);
  } else {
    names = split(list);
  }
  for (const std::string& n : names) find_workload(n);  // throws for an unknown name
  return names;
}

TimingOptions bench_timing(const Context& ctx) {
  TimingOptions t;
  t.repeats = ctx.vm["repeats"].as<int>();
  return t;
}

// GFLOP/s of a float32 GEMM (1024 x 1024 weights on 2048 rows) run by the cpu_tbb plugin's
// Eigen, on one thread: the single-core peak the step records are compared with.
double measure_peak_gflops(Context& ctx, std::vector<BenchRecord>& records) {
  const LayerFactory factory = LayerFactory::with_builtins();
  Model model(Shape{{1024}});
  model.add(
      factory.create("linear", {{"out_features", 1024}, {"bias", false}}, model.output_shape()));
  model.initialize(0);
  const auto loss = make_loss("mse");
  Batch batch;
  batch.inputs = Matrix<double>::Random(2048, 1024);
  batch.targets.values = Matrix<double>::Zero(2048, 1024);
  EvaluatorRequest request;
  request.backend = "cpu_tbb";
  request.options.dtype = DType::f32;
  request.options.threads = 1;
  auto evaluator = ctx.registry.make_evaluator(model, *loss, request);
  evaluator->register_batch(batch);
  std::vector<double> cpu_ms;
  const Timing t = time_calls(
      [&] {
        const double cpu0 = thread_cpu_ms();
        evaluator->evaluate_base(model.parameters());
        cpu_ms.push_back(thread_cpu_ms() - cpu0);
      },
      {5, 2, 0.5});
  std::sort(cpu_ms.end() - t.reps, cpu_ms.end());
  const double cpu_median = *(cpu_ms.end() - t.reps + t.reps / 2);
  // On a shared machine the calling thread's CPU time is the better measure of the core.
  const double gflops = 2.0 * 2048 * 1024 * 1024 / (std::min(t.median_ms, cpu_median) * 1e6);
  BenchRecord r;
  r.suite = "step";
  r.workload = "peak-sgemm";
  r.path = "eigen-gemm";
  r.threads = 1;
  r.batch = 2048;
  r.timing = t;
  r.extra = {{"gflops", gflops},
             {"thread_cpu_median_ms", cpu_median},
             {"what",
              "1024x1024 float32 weights on 2048 rows through the cpu_tbb plugin's Eigen "
              "GEMM (evaluate_base: includes the loss and copies, so a lower bound)"}};
  records.push_back(r);
  return gflops;
}

OptimizerConfig complete_step_config(const Workload& w, const std::string& regime) {
  const StepRegime* mode = nullptr;
  for (const StepRegime& r : kRegimes)
    if (regime == r.name) mode = &r;
  if (mode == nullptr) throw UsageError("unknown step regime '" + regime + "'");
  OptimizerConfig config;
  config.particle_dim = w.spec.d;
  config.subspace_particle_dim = w.spec.d;
  config.polytope = w.spec.polytope;
  config.step_radius = mode->step_radius;
  config.probe_radius = mode->probe_radius;
  config.epsilon = mode->epsilon;
  config.schedule = ScheduleKind::constant;
  config.radius.kind = mode->radius;
  config.seed = 1;
  return config;
}

namespace {

// Complete optimizer steps on one workload: PolytopeOptimizer::step() as `train` calls it
// (rotations, the candidates, their losses and the incumbent's, the cost matrix, the
// transport solve, the move), each timed call one more step of the same run.
BenchRecord time_complete_steps(Context& ctx, const std::string& name, const std::string& regime,
                                const std::string& device, int threads, bool host_transport,
                                bool device_rotations, CandidateDType candidates) {
  const StepRegime* mode = nullptr;
  for (const StepRegime& r : kRegimes)
    if (regime == r.name) mode = &r;
  Workload w = build_workload(find_workload(name), 0, &ctx.registry);
  OptimizerConfig config = complete_step_config(w, regime);
  config.device_transport = !host_transport;
  config.device_rotations = device_rotations;
  PolytopeOptimizer optimizer(*w.model, config, w.subspace.get());
  auto evaluator = ctx.registry.make_evaluator(
      *w.model, *w.loss, step_request(ctx, w, device, threads, "", candidates));
  optimizer.register_evaluator(*evaluator, w.batch);
  StepInfo last;
  std::vector<double> cpu_ms;
  double last_step_ms = 0;
  const Timing t = time_calls(
      [&] {
        const double cpu0 = thread_cpu_ms();
        const auto start = std::chrono::steady_clock::now();
        last = optimizer.step();
        last_step_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        cpu_ms.push_back(thread_cpu_ms() - cpu0);
      },
      bench_timing(ctx));
  BenchRecord r;
  r.suite = "step";
  r.workload = name;
  r.device = device;
  // The suffixes name what differs from `polyprobe train`'s defaults.
  r.path = (host_transport ? regime + "+host-transport"
                           : regime + (device_rotations ? "" : "+host-rotations")) +
           dtype_suffix(candidates);
  r.threads = threads;
  r.candidates = last.candidates;
  r.batch = w.spec.batch;
  r.timing = t;
  // The losses of these steps are the evaluation regime's paths at another radius; their
  // parity is that regime's (and the conformance tests', at every radius).
  r.max_rel_diff = std::numeric_limits<double>::quiet_NaN();
  const nlohmann::json explain = evaluator->explain();
  r.extra["regime"] = regime;
  r.extra["candidate_dtype"] = std::string(to_string(candidates));
  r.extra["what"] =
      "complete optimizer steps: rotations, candidates, losses (and the incumbent's), cost "
      "matrix, transport solve, move; constant schedule";
  r.extra["probe_displacement"] = 0.5 * mode->probe_radius * mode->epsilon;
  r.extra["radius_model"] = std::string(to_string(mode->radius));
  r.extra["evaluator"] = evaluator->name();
  r.extra["last_step_mean_cost"] = last.mean_cost;
  r.extra["host_peak_rss_bytes"] = peak_rss_bytes();
  const nlohmann::json plugin = explain.value("plugin", nlohmann::json::object());
  // Where the last timed step went: the backend's own phases of its score call (when it
  // reports them), beside the whole step; the rest is the optimizer's work and the host's.
  r.extra["last_step_ms"] = last_step_ms;
  const StepInfo::Phases& ph = last.phase_ms;
  r.extra["last_step_phases_ms"] = {
      {"plan", ph.plan}, {"score", ph.score}, {"cost", ph.cost},  {"transport", ph.transport},
      {"move", ph.move}, {"tail", ph.tail},   {"apply", ph.apply}};
  if (plugin.contains("last_call_ms")) r.extra["last_call_ms"] = plugin["last_call_ms"];
  if (plugin.contains("device_peak_bytes"))
    r.extra["device_peak_bytes"] = plugin["device_peak_bytes"];
  // Where the cost matrix, solve and move ran, and what one step moved over the bus.
  r.extra["transport"] =
      !host_transport && evaluator->solves_transport() ? "backend device" : "host";
  for (const char* key : {"step_bytes_to_host", "step_bytes_to_device"})
    if (plugin.contains(key)) r.extra[key] = plugin[key];
  // Who drew the step's rotations: the backend only where it says it draws them for this d
  // (and the step leaves them to it); else the host, and sent up.
  r.extra["rotations"] = device_rotations && !host_transport && evaluator->solves_transport() &&
                                 evaluator->draws_rotations(config.particle_dim)
                             ? "backend device"
                             : "host";
  r.extra["transport_iterations"] = last.transport_iterations;
  r.extra["candidates_per_second"] = static_cast<double>(last.candidates) / (t.median_ms * 1e-3);
  if (threads == 1 && device == "cpu") {
    r.extra["thread_cpu_median_ms"] = timed_median(cpu_ms, t.reps);
  }
  if (const auto it = baselines().find(name); it != baselines().end() && device == "cpu") {
    // The reference's methods are exact at any radius: its time is the same at both.
    const double torch = threads == 1 ? it->second.torch_1 : it->second.torch_all;
    r.extra["torch_best_ms"] = torch;
    r.extra["speedup_vs_torch_best"] = torch / t.median_ms;
    if (threads == 1 && it->second.seed_1 > 0)
      r.extra["speedup_vs_seed"] = it->second.seed_1 / t.median_ms;
  }
  if (name == "mnist128-rank8") r.extra["polystep_h200_candidates_per_second"] = 17088 / 0.3545;
  if (!ctx.quiet)
    *ctx.err << name << " " << r.path << " " << device << " " << threads
             << " threads: " << t.median_ms << " ms\n";
  return r;
}

std::vector<BenchRecord> run_step(Context& ctx) {
  std::vector<BenchRecord> records;
  const double peak = ctx.vm["no-peak"].as<bool>() ? 0.0 : measure_peak_gflops(ctx, records);
  const auto paths = split(ctx.vm["paths"].as<std::string>());
  const int64_t sample_size = ctx.vm["parity-sample"].as<int64_t>();
  for (const std::string& name : bench_workload_names(ctx)) {
    Workload w = build_workload(find_workload(name), 0, &ctx.registry);
    const int64_t count = w.candidates();
    // The float64 reference on a random sample of candidates (all of them when few).
    std::vector<int64_t> sample(static_cast<std::size_t>(count));
    for (int64_t c = 0; c < count; ++c) sample[static_cast<std::size_t>(c)] = c;
    std::mt19937_64 rng(11);
    std::shuffle(sample.begin(), sample.end(), rng);
    sample.resize(static_cast<std::size_t>(std::min(count, sample_size)));
    std::sort(sample.begin(), sample.end());
    std::vector<int64_t> sample_particle;
    std::vector<double> sample_disp;
    for (const int64_t c : sample) {
      sample_particle.push_back(w.particle[static_cast<std::size_t>(c)]);
      for (int32_t k = 0; k < w.spec.d; ++k)
        sample_disp.push_back(w.displacement[static_cast<std::size_t>(c * w.spec.d + k)]);
    }
    EvaluatorOptions ref_options;
    ref_options.dtype = DType::f64;
    auto reference = make_reference_evaluator(*w.model, *w.loss, w.subspace.get(), ref_options);
    reference->register_batch(w.batch);
    std::vector<double> expect(sample.size());
    reference->evaluate(w.model->parameters(), {&w.particles, sample_particle, sample_disp},
                        expect);
    const double expect_base = reference->evaluate_base(w.model->parameters());

    const std::string device = ctx.vm["bench-device"].as<std::string>();
    // A device backend's candidate evaluation takes no host threads; a complete step's
    // optimizer work (rotations, solve, move) runs on the host's, for every backend.
    const std::vector<int> thread_counts =
        device == "cpu" ? bench_thread_counts(ctx) : std::vector<int>{1};
    const std::vector<std::string> regimes = regime_names(ctx);
    const std::vector<CandidateDType> dtypes = candidate_dtypes(ctx);
    for (const std::string& regime : regimes) {
      if (regime == "evaluation") continue;
      for (const int threads : bench_thread_counts(ctx))
        for (const std::string& transport : split(ctx.vm["transports"].as<std::string>())) {
          if (transport != "device" && transport != "host")
            throw UsageError("--transports: unknown '" + transport + "' (device, host)");
          const std::vector<std::string> choices = split(ctx.vm["rotations"].as<std::string>());
          for (const std::string& rotations : choices) {
            if (rotations != "device" && rotations != "host")
              throw UsageError("--rotations: unknown '" + rotations + "' (host, device)");
            // The backend draws rotations only where it solves the transport: with the host's
            // transport, one record, the host's rotations.
            if (transport == "host" && rotations != choices.front()) continue;
            for (const CandidateDType dtype : dtypes)
              records.push_back(
                  time_complete_steps(ctx, name, regime, device, threads, transport == "host",
                                      rotations == "device" && transport == "device", dtype));
          }
        }
    }
    if (std::find(regimes.begin(), regimes.end(), "evaluation") == regimes.end()) continue;
    for (const std::string& path : paths)
      for (const int threads : thread_counts)
        for (const CandidateDType dtype : dtypes) {
          auto evaluator = ctx.registry.make_evaluator(
              *w.model, *w.loss, step_request(ctx, w, device, threads, path, dtype));
          evaluator->register_batch(w.batch);
          std::vector<double> losses(static_cast<std::size_t>(count));
          double base = 0;
          std::vector<double> cpu_ms;  // the calling thread's CPU time per call
          const Timing t = time_calls(
              [&] {
                const double cpu0 = thread_cpu_ms();
                w.compute_displacements();
                base = evaluator->evaluate_base(w.model->parameters());
                evaluator->evaluate(w.model->parameters(), w.set(), losses);
                cpu_ms.push_back(thread_cpu_ms() - cpu0);
              },
              bench_timing(ctx));
          double worst = std::abs(base - expect_base) / std::abs(expect_base);
          for (std::size_t i = 0; i < sample.size(); ++i)
            worst =
                std::max(worst, std::abs(losses[static_cast<std::size_t>(sample[i])] - expect[i]) /
                                    std::abs(expect[i]));
          const nlohmann::json explain = evaluator->explain();
          BenchRecord r;
          r.suite = "step";
          r.workload = name;
          r.device = device;
          r.threads = threads;
          r.candidates = count;
          r.extra["regime"] = "evaluation";
          r.extra["candidate_dtype"] = std::string(to_string(dtype));
          r.extra["what"] =
              "candidate evaluation alone (displacements, incumbent forward, every candidate's "
              "loss) at the reference's displacement 0.5 x 1e-2, where radius-dependent "
              "shortcuts apply; see step@train for complete steps at the radius training uses";
          r.extra["host_peak_rss_bytes"] = peak_rss_bytes();
          r.batch = w.spec.batch;
          r.timing = t;
          r.max_rel_diff = worst;
          std::string ran = path;
          const nlohmann::json plugin = explain.value("plugin", nlohmann::json::object());
          if (plugin.contains("last_call_candidates_per_path")) {
            // Every path that scored candidates, most candidates first: "site-local+sparse".
            const auto& counts = plugin["last_call_candidates_per_path"];
            std::vector<std::pair<int64_t, std::string>> used;
            for (const auto& [p, n] : counts.items())
              if (n.get<int64_t>() > 0) used.emplace_back(-n.get<int64_t>(), p);
            std::sort(used.begin(), used.end());
            if (!used.empty()) ran.clear();
            for (const auto& [n, p] : used) ran += (ran.empty() ? "" : "+") + p;
            r.extra["candidates_per_path"] = counts;
          } else if (plugin.contains("path")) {
            ran = plugin["path"].get<std::string>();
          }
          for (const char* key : {"chunk_size", "memory_estimate_bytes", "device_peak_bytes",
                                  "last_call_gpu_ms_per_path"})
            if (plugin.contains(key)) r.extra[key] = plugin[key];
          r.path = (path == "auto" ? ran : path) + dtype_suffix(dtype);
          r.extra["evaluator"] = evaluator->name();
          if (threads == 1) {
            // With one thread the work runs on the calling thread: its CPU time is the call's
            // cost without the time other processes took from it (the machine is shared).
            r.extra["thread_cpu_median_ms"] = timed_median(cpu_ms, t.reps);
          }
          r.extra["parity_sample"] = sample.size();
          r.extra["us_per_candidate"] = 1e3 * t.median_ms / static_cast<double>(count);
          // FLOP estimates exist for the full-space paths (bench_workloads.cpp); subspace
          // steps mix sparse and dense directions per particle and are not estimated.
          if (!w.subspace && !w.spec.sizes.empty()) {
            const double flops = path == "auto" ? w.delta_flops() : w.dense_flops();
            r.extra["flops_estimate"] = flops;
            r.extra["gflops"] = flops / (t.median_ms * 1e6);
            r.extra["dense_path_flops"] = w.dense_flops();
            if (peak > 0)
              r.extra["fraction_of_single_core_peak"] =
                  flops / (t.median_ms * 1e6) / peak / threads;
          }
          if (const auto it = baselines().find(name); it != baselines().end()) {
            const double torch = threads == 1 ? it->second.torch_1 : it->second.torch_all;
            r.extra["torch_best_ms"] = torch;
            r.extra["speedup_vs_torch_best"] = torch / t.median_ms;
            if (threads == 1 && it->second.seed_1 > 0)
              r.extra["speedup_vs_seed"] = it->second.seed_1 / t.median_ms;
          }
          records.push_back(r);
          if (!ctx.quiet)
            *ctx.err << name << " " << r.path << " " << threads << " threads: " << t.median_ms
                     << " ms\n";
        }
  }
  return records;
}

}  // namespace

BenchSuite step_suite() {
  BenchSuite s;
  s.name = "step";
  s.summary =
      "one step's candidate evaluation on the PyTorch reference's workloads, with float64 parity";
  s.options = [](po::options_description& o) {
    o.add_options()("workloads", po::value<std::string>()->default_value("all"),
                    "step/forward/scale: comma-separated workloads (mlp64-full, mlp256-full, "
                    "mlp256-sub512, "
                    "mnist128-sub256, mnist64-full, conv-digits, cnn16-pool, attn-tokens, "
                    "mnist128-rank8, "
                    "mnist128-factored-r2, mnist128-sub414, mnist128-full, mlp256-deep) "
                    "or all of those; named only, for a GPU: attn-long (softmax attention over "
                    "1024 positions), cheri-seq (the seed's Cheri block, 1024 x 128, batch 64)")(
        "bench-threads", po::value<std::string>()->default_value("1,all"),
        "step/forward/accumulate: thread counts, e.g. 1,2,all")(
        "paths", po::value<std::string>()->default_value("auto"),
        "step: evaluation paths to time (auto, sparse, subspace-delta, site-local, dense, "
        "inplace, fallback)")("bench-backend", po::value<std::string>()->default_value("cpu_tbb"),
                              "step/forward/accumulate/scale: the evaluator backend")(
        "parity-sample", po::value<int64_t>()->default_value(512),
        "step: candidates checked against the float64 reference")(
        "no-peak", po::bool_switch(), "step: skip measuring the single-core GEMM peak")(
        "regimes", po::value<std::string>()->default_value("evaluation,step@reference,step@train"),
        "step: what to time: evaluation (candidate evaluation alone at the reference's "
        "displacement), step@reference and step@train (complete optimizer steps at the "
        "reference's radius and at train's default radius)")(
        "transports", po::value<std::string>()->default_value("device"),
        "step: where complete steps solve the transport: device (on the backend's device when "
        "it offers it, else the host), host, or device,host for both side by side")(
        "rotations", po::value<std::string>()->default_value("device"),
        "step: who draws a complete step's rotations: device (as train does: the backend draws "
        "them from the optimizer's stream where it solves the transport and can, else the "
        "host), host (drawn and sent up: --device-rotations off), or host,device side by side")(
        "candidate-dtypes", po::value<std::string>()->default_value("same"),
        "step: the candidates' precision, side by side: same (float32), bf16, fp16 "
        "(candidate_autocast, e.g. same,bf16,fp16 with --bench-device cuda)")(
        "bench-device", po::value<std::string>()->default_value("cpu"),
        "step/accumulate/factored/cheri: the device the backend runs on (cpu or cuda; "
        "accumulate with cuda times the cuda plugin's accumulators on device-resident data; "
        "cheri: cuda only)");
  };
  s.shared = {"repeats"};
  s.run = run_step;
  return s;
}

}  // namespace polyprobe::app
