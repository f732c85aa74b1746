// `polyprobe bench accumulate`: reduce-by-key with ~62 contributions per key (the seed
// svgd-segmented-near-field-pr.md's repeat factor), rows of width 3 and 64, float32 and
// float64, every cpu_tbb strategy and the core's reference, at each thread count. The
// figures justify the plugin's `auto` choice (docs/benchmarks.md).
#include "bench.hpp"

#include <polyprobe/accumulator.hpp>

#include <cmath>
#include <random>
#include <sstream>

namespace polyprobe::app {

std::vector<int> bench_thread_counts(const Context& ctx);

namespace {

template <class S>
void measure(Context& ctx, int64_t n_keys, int64_t n, int64_t width,
             std::vector<BenchRecord>& records) {
  std::mt19937_64 rng(17);
  std::vector<int64_t> keys(static_cast<std::size_t>(n));
  for (auto& k : keys) k = static_cast<int64_t>(rng() % static_cast<uint64_t>(n_keys));
  Matrix<S> values(n, width);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < values.size(); ++i) values.data()[i] = static_cast<S>(u(rng));
  Matrix<double> expect = Matrix<double>::Zero(n_keys, width);
  make_reference_accumulator()->accumulate(keys, values.template cast<double>(), expect);
  const std::string dtype = std::is_same_v<S, float> ? "float32" : "float64";
  Matrix<S> out(n_keys, width);
  auto record = [&](Accumulator& acc, const std::string& path, int threads) {
    BenchRecord r;
    r.suite = "accumulate";
    r.workload = "keys=" + std::to_string(n_keys) + ",rows=" + std::to_string(n) +
                 ",width=" + std::to_string(width);
    r.path = path;
    r.dtype = dtype;
    r.threads = threads;
    r.candidates = n;
    TimingOptions t;
    t.repeats = std::min(ctx.vm["repeats"].as<int>(), 5);
    t.min_warmup_seconds = 0.2;
    r.timing = time_calls(
        [&] {
          out.setZero();
          acc.accumulate(keys, values, out);
        },
        t);
    const double scale = 1.0 + expect.cwiseAbs().maxCoeff();
    r.max_rel_diff = (out.template cast<double>() - expect).cwiseAbs().maxCoeff() / scale;
    r.extra["strategy_used"] = acc.last_strategy();
    r.extra["gbytes_per_s"] =
        static_cast<double>(values.size()) * sizeof(S) / (r.timing.median_ms * 1e6);
    records.push_back(r);
    if (!ctx.quiet)
      *ctx.err << r.workload << " " << dtype << " " << path << " " << threads << ": "
               << r.timing.median_ms << " ms\n";
  };
  auto reference = make_reference_accumulator();
  record(*reference, "reference", 1);
  for (const int threads : bench_thread_counts(ctx))
    for (const std::string strategy : {"sequential", "scatter", "segment", "auto"}) {
      auto acc = ctx.registry.make_accumulator(ctx.vm["bench-backend"].as<std::string>(), strategy,
                                               threads);
      record(*acc, strategy, threads);
    }
}

// The cuda plugin's accumulators on data generated and kept on the GPU: ~62 and ~900
// contributions per key, each strategy beside a device-to-device copy of the same value
// bytes timed in the same call (the bandwidth yardstick).
std::vector<BenchRecord> run_device_accumulate(Context& ctx) {
  std::vector<BenchRecord> records;
  const int64_t n_keys = ctx.vm["accumulate-keys"].as<int64_t>();
  const int repeats = std::min(ctx.vm["repeats"].as<int>(), 9);
  for (const int64_t per_key : {int64_t{62}, int64_t{900}})
    for (const int64_t width : {int64_t{3}, int64_t{64}})
      for (const bool f32 : {true, false})
        for (const std::string strategy : {"scatter", "segment", "auto"}) {
          auto acc = ctx.registry.make_accumulator("cuda", strategy, 1);
          const int64_t rows = n_keys * per_key;
          const nlohmann::json j =
              nlohmann::json::parse(acc->device_benchmark(n_keys, rows, width, f32, repeats, 17));
          BenchRecord r;
          r.suite = "accumulate";
          r.workload = "keys=" + std::to_string(n_keys) + ",rows=" + std::to_string(rows) +
                       ",width=" + std::to_string(width);
          r.path = strategy;
          r.device = "cuda";
          r.dtype = f32 ? "float32" : "float64";
          r.candidates = rows;
          r.timing =
              timing_of(j.at("cold_ms").get<double>(), j.at("times_ms").get<std::vector<double>>());
          const Timing copy = timing_of(0, j.at("copy_times_ms").get<std::vector<double>>());
          // The bytes the reduction must move (values and keys read, the output written once)
          // against the copy's (read and written), both over their median times.
          const double moved = j.at("value_bytes").get<double>() + j.at("key_bytes").get<double>() +
                               static_cast<double>(n_keys * width) * (f32 ? 4.0 : 8.0);
          r.max_rel_diff =
              j.at("max_abs_diff").get<double>() / (1.0 + j.at("max_abs_sum").get<double>());
          r.extra["strategy_used"] = j.at("strategy_used");
          r.extra["contributions_per_key"] = per_key;
          r.extra["gbytes_per_s"] = moved / (r.timing.median_ms * 1e6);
          r.extra["copy_gbytes_per_s"] =
              2.0 * j.at("copy_bytes").get<double>() / (copy.median_ms * 1e6);
          r.extra["fraction_of_copy"] =
              r.extra["gbytes_per_s"].get<double>() / r.extra["copy_gbytes_per_s"].get<double>();
          records.push_back(r);
          if (!ctx.quiet)
            *ctx.err << r.workload << " " << r.dtype << " " << strategy
                     << " (cuda): " << r.timing.median_ms << " ms, "
                     << r.extra["fraction_of_copy"].get<double>() << " of the copy's bandwidth\n";
        }
  return records;
}

std::vector<BenchRecord> run_accumulate(Context& ctx) {
  if (ctx.vm["bench-device"].as<std::string>() == "cuda") return run_device_accumulate(ctx);
  if (ctx.vm["bench-device"].as<std::string>() != "cpu")
    throw UsageError("--bench-device must be cpu or cuda");
  std::vector<BenchRecord> records;
  const int64_t n_keys = ctx.vm["accumulate-keys"].as<int64_t>();
  const int64_t n = n_keys * 62;
  for (const int64_t width : {int64_t{3}, int64_t{64}}) {
    measure<float>(ctx, n_keys, n, width, records);
    measure<double>(ctx, n_keys, n, width, records);
  }
  return records;
}

}  // namespace

BenchSuite accumulate_suite() {
  BenchSuite s;
  s.name = "accumulate";
  s.summary =
      "reduce-by-key, ~62 contributions per key, widths 3 and 64, float32/float64, every strategy "
      "(--bench-device cuda: the GPU's, at ~62 and ~900 per key, beside a device copy)";
  s.options = [](po::options_description& o) {
    o.add_options()("accumulate-keys", po::value<int64_t>()->default_value(100000),
                    "accumulate: number of keys");
  };
  s.shared = {"repeats", "bench-threads", "bench-backend", "bench-device"};
  s.run = run_accumulate;
  return s;
}

}  // namespace polyprobe::app
