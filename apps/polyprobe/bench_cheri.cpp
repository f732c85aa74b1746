// `polyprobe bench cheri`: the Cheri block forward (docs/design.md section 6) on the GPU, run by
// the cuda plugin's own benchmark (pp_plugin.bench) and read here against the published
// H200 times of the original (shared/seeds/cheri-block-benchmarks.rst, "megakernel +
// .eval()") and against two floors computed from the plugin's measured ceilings:
//   matrix floor = 4 N L C H FLOPs (two GEMMs) / the measured bf16 tensor-core rate (cuBLAS);
//   bytes floor  = bytes moved (x read twice, y written once) / the measured copy bandwidth.
#include "bench.hpp"

#include <polyprobe/error.hpp>

#include <iomanip>
#include <map>
#include <sstream>

namespace polyprobe::app {

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// The original's published times (ms) at L = 1024, C = 128, dilation 4, e = 2.
double seed_ms(int64_t batch, const std::string& dtype) {
  static const std::map<std::pair<int64_t, std::string>, double> table = {
      {{16, "float32"}, 0.065}, {{64, "float32"}, 0.074}, {{512, "float32"}, 0.498},
      {{16, "bf16"}, 0.062},    {{64, "bf16"}, 0.062},    {{512, "bf16"}, 0.347},
      {{16, "fp16"}, 0.062},    {{64, "fp16"}, 0.062},    {{512, "fp16"}, 0.347}};
  const auto it = table.find({batch, dtype});
  return it == table.end() ? 0.0 : it->second;
}

Timing timing_of(const nlohmann::json& r) {
  Timing t;
  t.cold_ms = r.value("cold_ms", 0.0);
  t.median_ms = r.value("median_ms", 0.0);
  t.iqr_ms = r.value("iqr_ms", 0.0);
  t.min_ms = r.value("min_ms", 0.0);
  t.max_ms = r.value("max_ms", 0.0);
  t.reps = r.value("reps", 0);
  t.times_ms = r.value("times_ms", std::vector<double>{});
  return t;
}

std::vector<BenchRecord> run_cheri(Context& ctx) {
  const std::string device = ctx.vm["bench-device"].as<std::string>();
  if (device != "cuda")
    throw UsageError("bench cheri times the cuda plugin's kernels: pass --bench-device cuda");
  nlohmann::json options = {{"repeats", ctx.vm["repeats"].as<int>()}};
  try {
    std::vector<int64_t> batches;
    for (const std::string& b : split_list(ctx.vm["cheri-batches"].as<std::string>()))
      batches.push_back(std::stoll(b));
    options["batches"] = batches;
  } catch (const std::exception&) {
    throw UsageError("--cheri-batches: a comma-separated list of batch sizes, e.g. 16,64,512");
  }
  options["dtypes"] = split_list(ctx.vm["cheri-dtypes"].as<std::string>());
  const nlohmann::json result = ctx.registry.run_plugin_bench("cuda", "cheri", options);

  double tflops = 0, gbps = 0;
  for (const auto& r : result.at("records")) {
    if (r.contains("tflops")) tflops = r["tflops"].get<double>();
    if (r.contains("gbps")) gbps = r["gbps"].get<double>();
  }
  std::vector<BenchRecord> records;
  for (const auto& r : result.at("records")) {
    BenchRecord b;
    b.suite = "cheri";
    b.device = "cuda";
    b.workload = r.value("workload", "");
    b.path = r.value("path", "");
    b.dtype = r.value("dtype", "");
    b.batch = r.value("batch", int64_t{0});
    b.timing = timing_of(r);
    b.max_rel_diff = r.value("max_rel_diff", 0.0);
    for (const auto& [key, value] : r.items())
      if (key != "workload" && key != "path" && key != "dtype" && key != "batch" &&
          !key.ends_with("_ms") && key != "reps" && key != "max_rel_diff")
        b.extra[key] = value;
    if (r.contains("flops") && r.contains("bytes") && tflops > 0 && gbps > 0) {
      b.extra["matrix_floor_us"] = r["flops"].get<double>() / (tflops * 1e6);
      b.extra["bytes_floor_us"] = r["bytes"].get<double>() / (gbps * 1e3);
      b.extra["achieved_tflops"] = r["flops"].get<double>() / (b.timing.median_ms * 1e9);
    }
    const double seed = seed_ms(b.batch, b.dtype);
    if (seed > 0 && b.workload == "cheri L=1024 C=128 d=4 e=2") {
      b.extra["seed_ms"] = seed;
      b.extra["speedup_vs_seed"] = seed / b.timing.median_ms;
    }
    records.push_back(std::move(b));
  }
  return records;
}

void print_cheri(std::ostream& out, const std::vector<BenchRecord>& records) {
  const auto fixed = [](double value, int digits) {
    std::ostringstream s;
    s << std::fixed << std::setprecision(digits) << value;
    return s.str();
  };
  const auto number = [&](const nlohmann::json& extra, const char* key, int digits) {
    return extra.contains(key) ? fixed(extra[key].get<double>(), digits) : std::string("-");
  };
  std::vector<std::vector<std::string>> rows;
  rows.reserve(records.size());
  for (const BenchRecord& r : records) {
    std::string what = r.workload;
    if (r.extra.contains("tflops")) what += ": " + number(r.extra, "tflops", 0) + " TFLOP/s";
    if (r.extra.contains("gbps")) what += ": " + number(r.extra, "gbps", 0) + " GB/s";
    rows.push_back({what, r.batch > 0 ? std::to_string(r.batch) : "-", r.dtype,
                    r.extra.value("mlp", std::string("-")), fixed(r.timing.cold_ms, 3),
                    fixed(r.timing.median_ms, 4), fixed(r.timing.iqr_ms, 4),
                    number(r.extra, "seed_ms", 3), number(r.extra, "speedup_vs_seed", 2),
                    number(r.extra, "matrix_floor_us", 1), number(r.extra, "bytes_floor_us", 1),
                    number(r.extra, "max_abs_diff", 5)});
  }
  print_columns(out,
                {"workload", "N", "dtype", "mlp", "cold ms", "median ms", "iqr ms", "seed ms",
                 "x seed", "matrix floor us", "bytes floor us", "max abs diff"},
                {false, true, false, false, true, true, true, true, true, true, true, true}, rows);
  out << "paths:\n";
  std::map<std::string, bool> seen;
  for (const BenchRecord& r : records)
    if (r.extra.contains("mlp") && !seen[r.path]) {
      seen[r.path] = true;
      out << "  " << r.path << "\n";
    }
}

}  // namespace

BenchSuite cheri_suite() {
  BenchSuite s;
  s.name = "cheri";
  s.summary =
      "the Cheri block forward on the GPU (cuda plugin, --bench-device cuda) beside the "
      "original's published H200 times and the matrix and bytes floors";
  s.options = [](po::options_description& o) {
    o.add_options()("cheri-batches", po::value<std::string>()->default_value("16,64,512"),
                    "cheri: batch sizes N (L = 1024, C = 128, dilation 4, e = 2)")(
        "cheri-dtypes", po::value<std::string>()->default_value("float32,bf16,fp16"),
        "cheri: input types (float32, bf16, fp16)");
  };
  s.shared = {"repeats", "bench-device"};
  s.run = run_cheri;
  s.table = print_cheri;
  return s;
}

}  // namespace polyprobe::app
