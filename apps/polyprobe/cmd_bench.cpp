// `polyprobe bench SUITE`: run a benchmark suite and report every record.
#include "bench.hpp"
#include "train_ranks.hpp"

#include <polyprobe/atomic_file.hpp>
#include <polyprobe/error.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

namespace polyprobe::app {

// Suites live in bench_*.cpp files; add each one to the table below.
BenchSuite step_suite();           // bench_step.cpp
BenchSuite forward_suite();        // bench_forward.cpp
BenchSuite accumulate_suite();     // bench_accumulate.cpp
BenchSuite dfo_bench_suite();      // bench_dfo.cpp
BenchSuite asktell_bench_suite();  // bench_asktell.cpp
BenchSuite cheri_suite();          // bench_cheri.cpp
BenchSuite scale_suite();          // bench_scale.cpp
BenchSuite attention_suite();      // bench_attention.cpp
BenchSuite factored_suite();       // bench_factored.cpp

const std::vector<BenchSuite>& bench_suites() {
  static const std::vector<BenchSuite> suites = {
      step_suite(),  forward_suite(), accumulate_suite(), dfo_bench_suite(), asktell_bench_suite(),
      cheri_suite(), scale_suite(),   attention_suite(),  factored_suite()};
  return suites;
}

namespace {

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

}  // namespace

void print_columns(std::ostream& out, const std::vector<std::string>& header,
                   const std::vector<bool>& right,
                   const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows)
    for (std::size_t c = 0; c < std::min(row.size(), width.size()); ++c)
      width[c] = std::max(width[c], row[c].size());
  const auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (std::size_t c = 0; c < width.size(); ++c) {
      const std::string& cell = c < cells.size() ? cells[c] : std::string();
      const std::string pad(width[c] - std::min(width[c], cell.size()), ' ');
      if (c > 0) text += "  ";
      text += c < right.size() && right[c] ? pad + cell : cell + pad;
    }
    text.erase(text.find_last_not_of(' ') + 1);
    out << text << "\n";
  };
  line(header);
  for (const auto& row : rows) line(row);
}

void print_records(std::ostream& out, const std::vector<BenchRecord>& records) {
  const auto fixed = [](double value, int digits, bool scientific = false) {
    std::ostringstream s;
    s << (scientific ? std::scientific : std::fixed) << std::setprecision(digits) << value;
    return s.str();
  };
  std::vector<std::vector<std::string>> rows;
  rows.reserve(records.size());
  for (const BenchRecord& r : records)
    rows.push_back({r.workload, r.path, std::to_string(r.threads), std::to_string(r.candidates),
                    fixed(r.timing.cold_ms, 3), fixed(r.timing.median_ms, 3),
                    fixed(r.timing.iqr_ms, 3), fixed(r.max_rel_diff, 1, true)});
  print_columns(out,
                {"workload", "path", "threads", "candidates", "cold ms", "median ms", "iqr ms",
                 "max rel diff"},
                {false, false, true, true, true, true, true, true}, rows);
}

Timing time_calls(const std::function<void()>& call, const TimingOptions& options) {
  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  };
  Timing t;
  auto t0 = clock::now();
  call();
  t.cold_ms = ms_since(t0);
  const auto warm_start = clock::now();
  for (int i = 1;
       i < options.min_warmup || ms_since(warm_start) < 1000.0 * options.min_warmup_seconds; ++i)
    call();
  for (int i = 0; i < options.repeats; ++i) {
    t0 = clock::now();
    call();
    t.times_ms.push_back(ms_since(t0));
  }
  return timing_of(t.cold_ms, std::move(t.times_ms));
}

Timing timing_of(double cold_ms, std::vector<double> times_ms) {
  if (times_ms.empty()) throw Error("a timing needs at least one timed repetition");
  Timing t;
  t.cold_ms = cold_ms;
  t.times_ms = std::move(times_ms);
  t.reps = static_cast<int>(t.times_ms.size());
  t.median_ms = percentile(t.times_ms, 0.5);
  t.iqr_ms = percentile(t.times_ms, 0.75) - percentile(t.times_ms, 0.25);
  t.min_ms = *std::min_element(t.times_ms.begin(), t.times_ms.end());
  t.max_ms = *std::max_element(t.times_ms.begin(), t.times_ms.end());
  return t;
}

nlohmann::json BenchRecord::to_json() const {
  nlohmann::json j = {{"suite", suite},
                      {"workload", workload},
                      {"path", path},
                      {"device", device},
                      {"dtype", dtype},
                      {"threads", threads},
                      {"candidates", candidates},
                      {"batch", batch},
                      {"cold_ms", timing.cold_ms},
                      {"median_ms", timing.median_ms},
                      {"iqr_ms", timing.iqr_ms},
                      {"min_ms", timing.min_ms},
                      {"max_ms", timing.max_ms},
                      {"reps", timing.reps},
                      {"times_ms", timing.times_ms},
                      {"max_rel_diff", max_rel_diff}};
  for (const auto& [key, value] : extra.items()) j[key] = value;
  return j;
}

nlohmann::json bench_environment() {
  std::string cpu = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  return {{"cpu", cpu},
          {"hardware_threads", std::thread::hardware_concurrency()},
          {"compiler", __VERSION__},
          {"polyprobe", POLYPROBE_VERSION}};
}

namespace {

// The long names an options function declares.
std::vector<std::string> declared(const std::function<void(po::options_description&)>& options) {
  std::vector<std::string> names;
  if (!options) return names;
  po::options_description o;
  options(o);
  for (const auto& option : o.options()) names.push_back(option->long_name());
  return names;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Leaves in ctx.vm only what `suite` reads of the bench command's options (its own, its
// BenchSuite::shared, --json), and the common options. One the user gave that it does not
// read is refused, naming the suites that read it: a suite quietly running on another's
// default (bench forward --bench-device cuda timing the CPU) is a wrong number in a table.
void keep_suite_options(Context& ctx, const BenchSuite& suite) {
  std::vector<std::string> bench = {"suite", "json", "repeats"};
  for (const BenchSuite& s : bench_suites())
    for (const std::string& name : declared(s.options)) bench.push_back(name);
  std::vector<std::string> reads = declared(suite.options);
  reads.insert(reads.end(), suite.shared.begin(), suite.shared.end());
  reads.insert(reads.end(), {"suite", "json"});
  for (auto it = ctx.vm.begin(); it != ctx.vm.end();) {
    const std::string& name = it->first;
    if (!contains(bench, name) || contains(reads, name)) {
      ++it;
      continue;
    }
    if (!it->second.defaulted()) {
      std::string readers;
      for (const BenchSuite& s : bench_suites())
        if (contains(declared(s.options), name) || contains(s.shared, name))
          readers += (readers.empty() ? "" : ", ") + s.name;
      throw UsageError("--" + name + " is not an option of `bench " + suite.name +
                       "`, which would ignore it (it is read by: " + readers +
                       "); drop it, or run one of those suites");
    }
    it = ctx.vm.erase(it);
  }
}

int run(Context& ctx) {
  const std::string name = ctx.vm.count("suite") ? ctx.vm["suite"].as<std::string>() : "";
  const auto& suites = bench_suites();
  auto it = std::find_if(suites.begin(), suites.end(),
                         [&](const BenchSuite& s) { return s.name == name; });
  if (it == suites.end()) {
    std::string known;
    for (const auto& s : suites) known += (known.empty() ? "" : ", ") + s.name;
    throw UsageError(
        (name.empty() ? std::string("no suite given") : "unknown suite '" + name + "'") +
        " (suites: " + (known.empty() ? "none" : known) + ")");
  }
  keep_suite_options(ctx, *it);
  // The --json file is checked before the suite runs, not after minutes of measurements.
  if (ctx.vm.count("json") && leader_process()) {
    try {
      io::check_output_file(ctx.vm["json"].as<std::string>(), "--json file");
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
  }
  const std::vector<BenchRecord> records = it->run(ctx);
  if (it->table)
    it->table(*ctx.out, records);
  else
    print_records(*ctx.out, records);
  // Under mpirun (bench scale) rank 0 alone writes the file.
  if (ctx.vm.count("json") && leader_process()) {
    const std::string path = ctx.vm["json"].as<std::string>();
    nlohmann::json list = nlohmann::json::array();
    for (const auto& r : records) list.push_back(r.to_json());
    io::write_file_atomically(path, [&](std::ostream& file) {
      file << nlohmann::json{{"records", list}, {"env", bench_environment()}}.dump(1) << "\n";
    });
    *ctx.out << "wrote " << records.size() << " records to " << path << "\n";
  }
  return 0;
}

}  // namespace

Command bench_command() {
  Command c;
  c.name = "bench";
  c.summary = "run a benchmark suite: cold time, median and spread, side by side with baselines";
  std::string description = "suites:\n";
  for (const auto& s : bench_suites()) description += "  " + s.name + ": " + s.summary + "\n";
  description +=
      "\nEach record reports the cold (first) call, then the median and interquartile range of\n"
      "timed calls after an untimed warm-up, and the largest relative difference of its results\n"
      "from the float64 reference. Run one timing job at a time on a quiet machine.\n\n"
      "examples:\n"
      "  polyprobe bench asktell --json results.json\n"
      "  polyprobe bench dfo --dfo-problems rosenbrock --dfo-max-n 10";
  c.description = description;
  c.options = [](po::options_description& o, po::positional_options_description& p) {
    o.add_options()("suite", po::value<std::string>()->value_name("SUITE"), "the suite to run")(
        "json", po::value<std::string>()->value_name("FILE"),
        "also write the records as JSON to FILE")("repeats", po::value<int>()->default_value(7),
                                                  "timed calls per record");
    for (const auto& s : bench_suites())
      if (s.options) s.options(o);
    p.add("suite", 1);
  };
  c.run = run;
  return c;
}

}  // namespace polyprobe::app
