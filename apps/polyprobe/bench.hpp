// The benchmark harness behind `polyprobe bench SUITE`.
//
// A suite measures named workloads and reports one BenchRecord per (workload, path,
// threads, ...) with cold time, median and interquartile range over timed repetitions
// after untimed warm-up, and the largest relative difference of its results from the
// reference. Baselines are measured in the same process, side by side. Records print as a
// table and, with --json FILE, are written as {"records": [...], "env": {...}}.
#pragma once

#include "cli.hpp"

#include <nlohmann/json.hpp>

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace polyprobe::app {

struct Timing {
  double cold_ms = 0;
  double median_ms = 0;
  double iqr_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
  int reps = 0;
  std::vector<double> times_ms;
};

struct TimingOptions {
  int repeats = 7;
  int min_warmup = 2;
  double min_warmup_seconds = 0.5;  // short calls right after idling run slow for a while
};

// Times `call`: the first call is cold, then warm-up calls (untimed), then `repeats` timed.
Timing time_calls(const std::function<void()>& call, const TimingOptions& options = {});
// The same summary of times measured elsewhere (a device's own events): throws Error when
// `times_ms` is empty.
Timing timing_of(double cold_ms, std::vector<double> times_ms);

struct BenchRecord {
  std::string suite, workload, path, device = "cpu", dtype = "float32";
  int threads = 1;
  int64_t candidates = 0, batch = 0;
  Timing timing;
  double max_rel_diff = 0;                          // against the reference (float64)
  nlohmann::json extra = nlohmann::json::object();  // suite-specific fields
  nlohmann::json to_json() const;
};

struct BenchSuite {
  std::string name;
  std::string summary;
  std::function<void(po::options_description&)> options;  // (optional) suite options
  std::function<std::vector<BenchRecord>(Context&)> run;
  // (optional) prints the closing table of `run`'s records; null: one row per record with
  // its timing (print_records).
  std::function<void(std::ostream&, const std::vector<BenchRecord>&)> table = nullptr;
  // The bench command's options that the suite reads beyond its own: --repeats and those the
  // step suite declares for several suites (--bench-backend, --bench-device, --bench-threads,
  // --workloads). The suite runs with only these, its own and the common options in
  // Context::vm: reading another is an error at once, and a user's option it would not read
  // is refused naming the suites that read it (cmd_bench.cpp).
  std::vector<std::string> shared = {};
};

// A plain-text table: every column as wide as its widest cell (header included), two spaces
// between columns; the columns flagged in `right` are right-aligned (numbers).
void print_columns(std::ostream& out, const std::vector<std::string>& header,
                   const std::vector<bool>& right,
                   const std::vector<std::vector<std::string>>& rows);

// The common closing table: workload, path, threads, candidates, cold, median and iqr ms, max
// rel diff, one row per record.
void print_records(std::ostream& out, const std::vector<BenchRecord>& records);

// The step suite's options as read (bench_step.cpp), for the suites that take them too
// (forward; scale's --workloads): --bench-threads, --workloads (names checked) and --repeats.
std::vector<int> bench_thread_counts(const Context& ctx);
std::vector<std::string> bench_workload_names(const Context& ctx);
TimingOptions bench_timing(const Context& ctx);

// The suites, in the order `polyprobe bench --help` lists them (cmd_bench.cpp).
const std::vector<BenchSuite>& bench_suites();

// Facts about the machine for the JSON "env" block (CPU model, cores, compiler).
nlohmann::json bench_environment();

}  // namespace polyprobe::app
