// `polyprobe bench scale`: complete optimizer steps at train's radii with the candidates
// sharded over the MPI ranks this process belongs to (`mpirun -np N polyprobe bench scale`),
// T threads a rank; where the step's time goes: the slowest rank's scoring, the imbalance
// between ranks, the all-gather, and the replicated rest of the step (rotations, cost matrix,
// transport solve, move). scripts/bench-scale.sh runs it at several N x T side by side and
// prints the parallel efficiency against 1 rank x 1 thread (docs/scale.md).
#include "bench.hpp"
#include "bench_workloads.hpp"
#include "train_ranks.hpp"

#include <polyprobe/evaluator.hpp>
#include <polyprobe/optimizer.hpp>

#include <algorithm>
#include <iostream>
#include <sstream>

namespace polyprobe::app {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<BenchRecord> run_scale(Context& ctx) {
  TrainRanks ranks(300);
  const int threads = ctx.vm["scale-threads"].as<int>();
  if (threads < 1) throw UsageError("--scale-threads must be >= 1");
  TimingOptions timing;
  timing.repeats = ctx.vm["repeats"].as<int>();
  // Training runs thousands of steps; the cost-balanced cut settles within about five
  // (docs/scale.md), so the untimed steps let it settle and the timed ones are the steady state.
  timing.min_warmup = 8;
  timing.min_warmup_seconds = 0;  // the same number of calls on every rank (each is collective)
  std::vector<BenchRecord> records;
  std::vector<bool> finishes;  // sharded_finish of each run
  std::stringstream finish_list(ctx.vm["scale-finish"].as<std::string>());
  for (std::string f; std::getline(finish_list, f, ',');) {
    if (f != "sharded" && f != "gathered")
      throw UsageError("--scale-finish takes sharded and/or gathered, not '" + f + "'");
    finishes.push_back(f == "sharded");
  }
  std::vector<std::string> clocks;  // what each run's slices are balanced by
  std::stringstream clock_list(ctx.vm["scale-balance"].as<std::string>());
  for (std::string c; std::getline(clock_list, c, ',');) {
    if (c != "auto" && c != "cpu" && c != "wall")
      throw UsageError("--scale-balance takes auto, cpu and/or wall, not '" + c + "'");
    clocks.push_back(c);
  }
  std::vector<std::string> waits_list;  // how each run's ranks wait
  std::stringstream waits_text(ctx.vm["scale-waits"].as<std::string>());
  for (std::string w; std::getline(waits_text, w, ',');) {
    if (w != "auto" && w != "poll" && w != "pause")
      throw UsageError("--scale-waits takes auto, poll and/or pause, not '" + w + "'");
    waits_list.push_back(w);
  }
  struct Run {
    std::string workload;
    bool sharded_finish;
    std::string balance;
    std::string waits;
  };
  // --workloads (step's) names them here too, so that it is never silently ignored.
  const bool named_scale = !ctx.vm["scale-workloads"].defaulted();
  const bool named_step = ctx.vm.count("workloads") > 0 && !ctx.vm["workloads"].defaulted();
  if (named_scale && named_step)
    throw UsageError("bench scale: give the workloads once, by --workloads or --scale-workloads");
  std::vector<std::string> names;
  if (named_step) {
    names = bench_workload_names(ctx);
  } else {
    std::stringstream list(ctx.vm["scale-workloads"].as<std::string>());
    for (std::string name; std::getline(list, name, ',');) names.push_back(name);
  }
  std::vector<Run> runs;
  // The waits vary fastest: each workload's runs alternate them, so they share the machine's
  // moods.
  for (const std::string& name : names)
    for (const bool sharded : finishes)
      for (const std::string& clock : clocks)
        for (const std::string& w : waits_list) runs.push_back({name, sharded, clock, w});
  for (const auto& [name, sharded_finish, balance, waits] : runs) {
    Workload w = build_workload(find_workload(name));
    OptimizerConfig config = complete_step_config(w, "step@train");
    config.sharded_finish = sharded_finish;
    PolytopeOptimizer optimizer(*w.model, config, w.subspace.get());
    EvaluatorRequest request;
    request.backend = ctx.vm["bench-backend"].as<std::string>();
    request.options.dtype = DType::f32;
    request.options.threads = threads;
    request.subspace = w.subspace.get();
    auto evaluator = ranks.shard(ctx.registry.make_evaluator(*w.model, *w.loss, request), "mpi",
                                 false, balance, waits);
    optimizer.register_evaluator(*evaluator, w.batch);
    std::vector<double> score_ms, exchange_ms, score_cpu_ms, finish_exchange_ms;
    std::vector<double> step_slowest_ms, step_imbalance;  // each step's, over the ranks
    nlohmann::json slice = nlohmann::json::array();
    StepInfo last;
    int64_t finish_exchanges = 0;  // rank 0's in its last step
    const Timing t = time_calls(
        [&] {
          ranks.sync();  // every rank starts the step together
          last = optimizer.step();
          const nlohmann::json d = ranks.shard_account(*evaluator);
          if (!d.empty()) {
            finish_exchange_ms.push_back(d.value("finish_exchange_ms", 0.0));
            finish_exchanges = d.value("finish_exchanges", int64_t{0});
            score_ms.push_back(d.value("last_score_ms", 0.0));
            exchange_ms.push_back(d.value("last_exchange_ms", 0.0));
            score_cpu_ms.push_back(d.value("last_score_cpu_ms", 0.0));
            const double slowest = d.value("last_slowest_score_ms", 0.0);
            const double mean = d.value("last_mean_score_ms", 0.0);
            step_slowest_ms.push_back(slowest);
            step_imbalance.push_back(mean > 0 ? slowest / mean : 1.0);
            slice = d.value("last_slice", nlohmann::json::array());
          }
        },
        timing);
    // Each rank's medians over the timed calls, on rank 0.
    const auto timed = [&](const std::vector<double>& v) {
      return v.size() >= static_cast<std::size_t>(t.reps) ? median({v.end() - t.reps, v.end()})
                                                          : 0.0;
    };
    std::ostringstream mine;
    mine << timed(score_ms) << " " << timed(exchange_ms) << " " << timed(score_cpu_ms) << " "
         << (slice.size() == 2 ? slice[1].get<int64_t>() - slice[0].get<int64_t>() : 0) << " "
         << timed(finish_exchange_ms);
    double score_max = 0, score_sum = 0, exchange_min = 1e300;
    nlohmann::json particles = nlohmann::json::array();  // each rank's in the last step
    nlohmann::json score_per_rank = nlohmann::json::array(), cpu_per_rank = score_per_rank,
                   finish_exchange_per_rank = score_per_rank;
    double cpu_max = 0, cpu_sum = 0;
    for (const std::string& text : ranks.gather(mine.str())) {
      std::istringstream in(text);
      double s = 0, e = 0, c = 0, f = 0;
      int64_t p = 0;
      in >> s >> e >> c >> p >> f;
      finish_exchange_per_rank.push_back(f);
      particles.push_back(p);
      score_per_rank.push_back(s);
      cpu_per_rank.push_back(c);
      cpu_max = std::max(cpu_max, c);
      cpu_sum += c;
      score_max = std::max(score_max, s);
      score_sum += s;
      exchange_min = std::min(exchange_min, e);
    }
    BenchRecord r;
    r.suite = "scale";
    r.workload = name;
    r.path = sharded_finish ? "step@train" : "step@train+gathered-finish";
    if (balance != "auto") r.path += "+" + balance + "-balanced";
    if (waits != "auto") r.path += "+" + waits + "-waits";
    r.threads = threads;
    r.candidates = last.candidates;
    r.batch = w.spec.batch;
    r.timing = t;
    r.max_rel_diff = 0;  // the losses are the unsharded ones bit for bit (tests/distributed)
    r.extra["ranks"] = ranks.size();
    // What the slices were balanced by (auto: as train chooses), and why.
    if (ranks.size() > 1) r.extra["balanced_by"] = ranks.balance();
    // How the ranks waited in the exchanges, and why.
    if (ranks.size() > 1) r.extra["waits"] = ranks.waits();
    r.extra["cores"] = ranks.size() * threads;
    r.extra["evaluator"] = evaluator->name();
    // Rank 0's backend's own phases of its last call, when it reports them.
    const nlohmann::json plugin = evaluator->explain().value("plugin", nlohmann::json::object());
    if (plugin.contains("last_call_ms")) r.extra["last_call_ms"] = plugin["last_call_ms"];
    // Where rank 0's last timed step went (StepInfo::Phases).
    const StepInfo::Phases& ph = last.phase_ms;
    r.extra["last_step_phases_ms"] = {
        {"plan", ph.plan}, {"score", ph.score}, {"cost", ph.cost},  {"transport", ph.transport},
        {"move", ph.move}, {"tail", ph.tail},   {"apply", ph.apply}};
    r.extra["what"] =
        "complete optimizer steps at train's radii (step@train of bench step), candidates "
        "sharded over the ranks, losses all-gathered";
    if (ranks.size() > 1) {
      const double score_mean = score_sum / ranks.size();
      r.extra["score_max_ms"] = score_max;
      r.extra["score_mean_ms"] = score_mean;
      r.extra["imbalance"] = score_mean > 0 ? score_max / score_mean : 1.0;
      // The same step by step (the median over the timed steps of each step's slowest rank's
      // scoring over the mean): above `imbalance`, the ranks straggle in turn, which no cut
      // can foresee.
      r.extra["step_imbalance"] = timed(step_imbalance);
      r.extra["step_slowest_score_ms"] = timed(step_slowest_ms);
      // The rank that scored last waits for no one: its exchange is the all-gather itself.
      r.extra["allgather_ms"] = exchange_min;
      r.extra["particles_per_rank"] = particles;
      r.extra["score_ms_per_rank"] = score_per_rank;
      r.extra["score_cpu_ms_per_rank"] = cpu_per_rank;
      // Each rank's time in the sharded finish's exchanges (waits for slower ranks included).
      r.extra["finish_exchange_ms_per_rank"] = finish_exchange_per_rank;
      r.extra["finish_exchanges"] = finish_exchanges;
      // The same, in the CPU time of each rank's scoring (what the slices are balanced by where
      // ranks oversubscribe the cores).
      r.extra["cpu_imbalance"] = cpu_sum > 0 ? cpu_max / (cpu_sum / ranks.size()) : 1.0;
      r.extra["rest_ms"] = std::max(0.0, t.median_ms - score_max - exchange_min);
      r.extra["loss_bytes_per_rank"] = 8.0 * static_cast<double>(last.candidates);
    }
    if (!ctx.quiet)
      *ctx.err << name << " " << ranks.size() << " ranks x " << threads
               << " threads: " << t.median_ms << " ms\n";
    records.push_back(r);
  }
  return records;
}

std::string first_word(const std::string& text) { return text.substr(0, text.find(' ')); }

void print_scale(std::ostream& out, const std::vector<BenchRecord>& records) {
  std::vector<std::vector<std::string>> rows;
  const auto ms = [](const nlohmann::json& j, const char* key) {
    if (!j.contains(key)) return std::string("-");
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(2);
    s << j[key].get<double>();
    return s.str();
  };
  for (const BenchRecord& r : records) {
    nlohmann::json timing = {
        {"cold", r.timing.cold_ms}, {"median", r.timing.median_ms}, {"iqr", r.timing.iqr_ms}};
    rows.push_back({r.workload,
                    r.path.find("gathered") == std::string::npos ? "sharded" : "gathered",
                    first_word(r.extra.value("balanced_by", std::string("-"))),
                    first_word(r.extra.value("waits", std::string("-"))),
                    std::to_string(r.extra.value("ranks", 1)), std::to_string(r.threads),
                    std::to_string(r.candidates), ms(timing, "cold"), ms(timing, "median"),
                    ms(timing, "iqr"), ms(r.extra, "score_max_ms"), ms(r.extra, "imbalance"),
                    ms(r.extra, "allgather_ms"), ms(r.extra, "rest_ms")});
  }
  print_columns(
      out,
      {"workload", "finish", "balanced by", "waits", "ranks", "threads", "candidates", "cold ms",
       "median ms", "iqr ms", "slowest score ms", "imbalance", "all-gather ms", "rest ms"},
      {false, false, false, false, true, true, true, true, true, true, true, true, true, true},
      rows);
}

}  // namespace

BenchSuite scale_suite() {
  BenchSuite s;
  s.name = "scale";
  s.summary =
      "complete steps at train's radii with candidates sharded over MPI ranks (run under mpirun)";
  s.options = [](po::options_description& o) {
    o.add_options()("scale-workloads",
                    po::value<std::string>()->default_value("mlp256-full,mnist64-full"),
                    "scale: comma-separated workloads (or --workloads)")(
        "scale-threads", po::value<int>()->default_value(1), "scale: threads per rank")(
        "scale-finish", po::value<std::string>()->default_value("sharded"),
        "scale: how the ranks finish a step, comma-separated: sharded (each its own particles, "
        "sharing partial sums and moves) and/or gathered (every rank gathers all losses and "
        "finishes the whole step)")(
        "scale-balance", po::value<std::string>()->default_value("auto"),
        "scale: what the ranks' slices are balanced by, comma-separated: auto (as train "
        "--rank-balance auto), cpu (each rank's CPU time scoring its slice) and/or wall (its "
        "wall time)")(
        "scale-waits", po::value<std::string>()->default_value("auto"),
        "scale: how the ranks wait for each other, comma-separated: auto (as train --rank-waits "
        "auto), poll and/or pause");
  };
  s.shared = {"repeats", "workloads", "bench-backend"};
  s.run = run_scale;
  s.table = print_scale;
  return s;
}

}  // namespace polyprobe::app
