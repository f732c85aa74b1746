// `polyprobe bench attention`: the attention of 16 candidates x batch 16 (256 problems per
// head) at sequence lengths 6, 64 and 128, float32, one thread: the "sdpa" operation (the
// attention_sdpa plugin's fused kernel) against the explicit attention (scores, row
// weights, mix: the host layer's algorithm, an L x L matrix per head) in the same run, on
// the same random Q, K and V. bench/torch_sdpa.py times PyTorch's native SDPA on the same
// shapes (docs/benchmarks.md puts them side by side).
#include "bench.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/operations.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <random>
#include <sstream>

#include <time.h>

namespace polyprobe::app {
namespace {

using M = Matrix<float>;

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

// The explicit attention of every (problem, head): q, k, v and out [problems, heads, L, hd].
void explicit_attention(const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v, std::vector<float>& out, int64_t problems,
                        int64_t len, int64_t hd, bool argmax) {
  const float scale = 1.0F / std::sqrt(static_cast<float>(hd));
  M scores(len, len);
  for (int64_t p = 0; p < problems; ++p) {
    const Eigen::Map<const M> qp(q.data() + p * len * hd, len, hd),
        kp(k.data() + p * len * hd, len, hd), vp(v.data() + p * len * hd, len, hd);
    scores.noalias() = (qp * scale) * kp.transpose();
    for (Eigen::Index r = 0; r < len; ++r) {
      auto row = scores.row(r);
      Eigen::Index best = 0;
      for (Eigen::Index c = 1; c < len; ++c)
        if (row(c) > row(best)) best = c;
      if (argmax) {
        row.setZero();
        row(best) = 1.0F;
      } else {
        const float top = row(best);
        row = (row.array() - top).exp().matrix();
        row /= row.sum();
      }
    }
    Eigen::Map<M>(out.data() + p * len * hd, len, hd).noalias() = scores * vp;
  }
}

std::vector<BenchRecord> run_attention(Context& ctx) {
  if (ctx.vm["attention-device"].as<std::string>() != "cpu")
    throw UsageError(
        "bench attention: --attention-device cuda is not measured by this suite yet (the host "
        "app does not link the CUDA runtime); on a GPU machine, time the cuda sdpa with "
        "`test_attention_sdpa_cuda \"[.bench]\"` and bench/torch_sdpa.py --device cuda");
  const OperationTable::Entry* op =
      ctx.registry.operations().find(PP_OPERATION_SDPA, PP_DEVICE_NAME_CPU, PP_DTYPE_F32);
  const int64_t candidates = 16, batch = 16, problems = candidates * batch;
  const int64_t heads = ctx.vm["attention-heads"].as<int64_t>();
  const int64_t embed = ctx.vm["attention-embed"].as<int64_t>();
  if (heads <= 0 || embed % heads != 0)
    throw UsageError("bench attention: --attention-heads must divide --attention-embed");
  const int64_t hd = embed / heads;
  TimingOptions t;
  t.repeats = ctx.vm["repeats"].as<int>();
  std::vector<BenchRecord> records;
  for (const bool argmax : {false, true})
    for (const int64_t len : {int64_t{6}, int64_t{64}, int64_t{128}}) {
      std::mt19937_64 rng(static_cast<uint64_t>(len));
      std::normal_distribution<float> gauss;
      const auto n = static_cast<std::size_t>(problems * heads * len * hd);
      std::vector<float> q(n), k(n), v(n), want(n), got(n);
      for (auto* t3 : {&q, &k, &v})
        for (float& x : *t3) x = gauss(rng);
      auto record = [&](const std::string& path, const std::function<void()>& call,
                        const std::vector<float>& result) {
        BenchRecord r;
        r.suite = "attention";
        r.workload = std::string(argmax ? "argmax" : "softmax") + " L=" + std::to_string(len) +
                     " E=" + std::to_string(embed) + " heads=" + std::to_string(heads);
        r.path = path;
        r.threads = 1;
        r.candidates = candidates;
        r.batch = batch;
        std::vector<double> cpu_ms;
        r.timing = time_calls(
            [&] {
              const double cpu0 = thread_cpu_ms();
              call();
              cpu_ms.push_back(thread_cpu_ms() - cpu0);
            },
            t);
        // On a shared machine the calling thread's CPU time is the better measure of the core.
        std::vector<double> timed(cpu_ms.end() - r.timing.reps, cpu_ms.end());
        std::sort(timed.begin(), timed.end());
        r.extra["cpu_median_ms"] = timed[timed.size() / 2];
        r.extra["cpu_cold_ms"] = cpu_ms.front();
        double worst = 0;
        for (std::size_t i = 0; i < n; ++i)
          worst = std::max(worst, std::abs(static_cast<double>(result[i]) - want[i]) /
                                      std::max(1.0, std::abs(static_cast<double>(want[i]))));
        r.max_rel_diff = worst;
        r.extra["length"] = len;
        r.extra["argmax"] = argmax;
        records.push_back(r);
        if (!ctx.quiet)
          *ctx.err << r.workload << " " << path << ": " << r.timing.median_ms << " ms\n";
      };
      record(
          "explicit", [&] { explicit_attention(q, k, v, want, problems * heads, len, hd, argmax); },
          want);
      if (op == nullptr) continue;
      pp_sdpa_args a{};
      a.struct_size = sizeof(a);
      a.dtype = PP_DTYPE_F32;
      a.weighting = argmax ? PP_SDPA_ARGMAX : PP_SDPA_SOFTMAX;
      a.b0 = candidates, a.b1 = batch, a.heads = heads;
      a.q_len = a.kv_len = len, a.head_dim = a.v_dim = hd;
      a.scale = 1.0 / std::sqrt(static_cast<double>(hd));
      a.threads = 1;
      const int64_t st[4] = {batch * heads * len * hd, heads * len * hd, len * hd, hd};
      for (int i = 0; i < 4; ++i)
        a.q_strides[i] = a.k_strides[i] = a.v_strides[i] = a.out_strides[i] = st[i];
      a.q = q.data(), a.k = k.data(), a.v = v.data(), a.out = got.data();
      const auto* table = static_cast<const pp_sdpa_table*>(op->op->table);
      record(
          "sdpa (" + op->provider + ")",
          [&] {
            pp_error err{};
            if (table->run(&a, &err) != PP_OK)
              throw Error(std::string("bench attention: sdpa failed: ") + err.message);
          },
          got);
    }
  if (op == nullptr && !ctx.quiet)
    *ctx.err << "no sdpa operation is loaded (the attention_sdpa plugin): explicit only\n";
  return records;
}

}  // namespace

BenchSuite attention_suite() {
  BenchSuite s;
  s.name = "attention";
  s.summary =
      "attention of 16 candidates x batch 16 at L = 6, 64, 128: the sdpa operation vs explicit";
  s.options = [](po::options_description& o) {
    o.add_options()("attention-embed", po::value<int64_t>()->default_value(64),
                    "attention: embedding size E (heads x head size)")(
        "attention-heads", po::value<int64_t>()->default_value(4), "attention: heads")(
        "attention-device", po::value<std::string>()->default_value("cpu"),
        "attention: device (cpu; cuda is not measured by this suite yet)");
  };
  s.shared = {"repeats"};
  s.run = run_attention;
  s.table = [](std::ostream& out, const std::vector<BenchRecord>& records) {
    auto fixed = [](double value) {
      std::ostringstream text;
      text << std::fixed << std::setprecision(3) << value;
      return text.str();
    };
    std::vector<std::vector<std::string>> rows;
    rows.reserve(records.size());
    for (const BenchRecord& r : records) {
      std::ostringstream diff;
      diff << std::scientific << std::setprecision(1) << r.max_rel_diff;
      rows.push_back({r.workload, r.path, fixed(r.timing.cold_ms), fixed(r.timing.median_ms),
                      fixed(r.timing.iqr_ms), fixed(r.extra["cpu_median_ms"].get<double>()),
                      diff.str()});
    }
    print_columns(out,
                  {"workload", "attention", "cold ms", "median ms", "iqr ms", "cpu median ms",
                   "max rel diff"},
                  {false, false, true, true, true, true, true}, rows);
  };
  return s;
}

}  // namespace polyprobe::app
