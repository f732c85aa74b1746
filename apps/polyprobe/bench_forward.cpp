// `polyprobe bench forward`: the incumbent's forward and loss (evaluate_base) on the
// reference workloads, cpu_tbb against the core's reference evaluator.
#include "bench.hpp"
#include "bench_workloads.hpp"

#include <polyprobe/evaluator.hpp>

#include <cmath>

namespace polyprobe::app {

namespace {

std::vector<BenchRecord> run_forward(Context& ctx) {
  std::vector<BenchRecord> records;
  for (const std::string& name : bench_workload_names(ctx)) {
    const Workload w = build_workload(find_workload(name));
    EvaluatorOptions ref_options;
    ref_options.dtype = DType::f64;
    auto reference = make_reference_evaluator(*w.model, *w.loss, nullptr, ref_options);
    reference->register_batch(w.batch);
    const double expect = reference->evaluate_base(w.model->parameters());
    auto record = [&](Evaluator& evaluator, const std::string& path, int threads,
                      const std::string& dtype) {
      evaluator.register_batch(w.batch);
      double loss = 0;
      BenchRecord r;
      r.suite = "forward";
      r.workload = name;
      r.path = path;
      r.dtype = dtype;
      r.threads = threads;
      r.candidates = 1;
      r.batch = w.spec.batch;
      r.timing = time_calls([&] { loss = evaluator.evaluate_base(w.model->parameters()); },
                            bench_timing(ctx));
      r.max_rel_diff = std::abs(loss - expect) / std::abs(expect);
      records.push_back(r);
    };
    EvaluatorOptions f32;
    f32.dtype = DType::f32;
    auto ref32 = make_reference_evaluator(*w.model, *w.loss, nullptr, f32);
    record(*ref32, "reference", 1, "float32");
    for (const int threads : bench_thread_counts(ctx)) {
      EvaluatorRequest request;
      request.backend = ctx.vm["bench-backend"].as<std::string>();
      request.options.dtype = DType::f32;
      request.options.threads = threads;
      auto evaluator = ctx.registry.make_evaluator(*w.model, *w.loss, request);
      record(*evaluator, evaluator->name(), threads, "float32");
    }
  }
  return records;
}

}  // namespace

BenchSuite forward_suite() {
  BenchSuite s;
  s.name = "forward";
  s.summary = "the incumbent's forward and loss on the reference workloads (options as for step)";
  s.shared = {"repeats", "workloads", "bench-threads", "bench-backend"};
  s.run = run_forward;
  return s;
}

}  // namespace polyprobe::app
