// `polyprobe explain`: which evaluator serves a model, and per layer and particle block
// which evaluation path its candidates take and why the faster ones declined, with the
// chunk size and the memory estimate. It runs one step's candidates (every particle at
// every vertex of the simplex) on a random batch so that the counts are real.
#include "bench_workloads.hpp"
#include "cli.hpp"

#include <polyprobe/evaluator.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/operations.hpp>
#if __has_include(<polyprobe/model_file.hpp>)
#include <polyprobe/model_file.hpp>
#define POLYPROBE_HAVE_MODEL_FILES 1
#endif

#include <nlohmann/json.hpp>

#include <iomanip>
#include <iostream>
#include <random>

namespace polyprobe::app {
namespace {

// A model from MODEL.json or a reference workload, with a batch and one step's candidates.
Workload load(Context& ctx) {
  const std::string workload = ctx.vm["workload"].as<std::string>();
  if (!workload.empty()) return build_workload(find_workload(workload), 0, &ctx.registry);
  if (!ctx.vm.count("model")) throw UsageError("give MODEL.json or --workload NAME");
#ifdef POLYPROBE_HAVE_MODEL_FILES
  ModelFile file = read_model_file(ctx.vm["model"].as<std::string>(), ctx.layers);
  Workload w;
  w.spec = {ctx.vm["model"].as<std::string>(),
            {},
            ctx.vm["batch"].as<int64_t>(),
            0,
            ctx.vm["d"].as<int32_t>()};
  w.model = std::make_unique<Model>(std::move(file.model));
  w.model->initialize(0);
  w.loss = make_loss(file.loss, file.l2);
  const int64_t rows = w.spec.batch, classes = w.model->output_shape().numel();
  std::mt19937_64 rng(1);
  std::normal_distribution<double> gauss;
  w.batch.inputs.resize(rows, w.model->input_shape().numel());
  for (int64_t i = 0; i < w.batch.inputs.size(); ++i) w.batch.inputs.data()[i] = gauss(rng);
  if (w.loss->needs_labels())
    for (int64_t r = 0; r < rows; ++r)
      w.batch.targets.labels.push_back(
          static_cast<int64_t>(rng() % static_cast<uint64_t>(classes)));
  else
    w.batch.targets.values = Matrix<double>::Zero(rows, classes);
  const int32_t d = w.spec.d;
  w.particles = ParticleMap::contiguous(w.model->num_parameters(), d);
  w.vertices = d + 1;
  std::normal_distribution<double> step(0.0, 5e-3);
  for (int64_t p = 0; p < w.particles.count(); ++p)
    for (int32_t v = 0; v < w.vertices; ++v) {
      w.particle.push_back(p);
      for (int32_t k = 0; k < d; ++k) w.displacement.push_back(step(rng));
    }
  return w;
#else
  throw Error(
      "reading model files needs the core's model-file loader, which this build lacks; "
      "use --workload NAME");
#endif
}

int run(Context& ctx) {
  Workload w = load(ctx);
  EvaluatorRequest request = evaluator_request(ctx);
  request.subspace = w.subspace.get();
  request.path = ctx.vm["path"].as<std::string>();
  request.options.chunk_size = ctx.vm["chunk-size"].as<int64_t>();
  Selection selection;
  auto evaluator = ctx.registry.make_evaluator(*w.model, *w.loss, request, &selection);
  evaluator->register_batch(w.batch);
  std::vector<double> losses(static_cast<std::size_t>(w.candidates()));
  evaluator->evaluate(w.model->parameters(), w.set(), losses);
  const nlohmann::json explain = evaluator->explain();
  // Which attention the host's own forward of each self_attention layer runs (the incumbent,
  // the reference evaluator and every path that calls the layer).
  nlohmann::json host_attention = nlohmann::json::array();
  const int32_t dtype = request.options.dtype == DType::f32 ? PP_DTYPE_F32 : PP_DTYPE_F64;
  for (std::size_t l = 0; l < w.model->num_layers(); ++l)
    if (w.model->layer(l).kind() == "self_attention")
      host_attention.push_back(
          {{"layer", l},
           {"attention", describe_choice(ctx.layers.operations()->find(PP_OPERATION_SDPA,
                                                                       PP_DEVICE_NAME_CPU, dtype),
                                         PP_OPERATION_SDPA, PP_DEVICE_NAME_CPU, dtype)}});
  if (ctx.json) {
    *ctx.out << nlohmann::json{{"selection", selection.to_json()},
                               {"evaluator", explain},
                               {"host_attention", host_attention}}
                    .dump(1)
             << "\n";
    return 0;
  }
  std::ostream& out = *ctx.out;
  out << "model: " << w.spec.name << ", " << w.model->num_parameters() << " parameters, "
      << w.candidates() << " candidates (" << w.particles.count() << " particles x " << w.vertices
      << " vertices, d = " << w.particles.d << ")"
      << (w.subspace ? ", " + w.subspace->kind() + " subspace" : std::string(", full space"))
      << "\n";
  out << "evaluator: " << selection.chosen << "\n";
  for (const std::string& reason : selection.reasons) out << "  " << reason << "\n";
  for (const auto& a : host_attention)
    out << "host forward of layer " << a["layer"] << " (self_attention): attention "
        << a["attention"].get<std::string>() << "\n";
  if (!explain.contains("plugin")) {
    out << explain.dump(1) << "\n";
    return 0;
  }
  const nlohmann::json& p = explain["plugin"];
  if (!p.contains("last_call_candidates_per_path")) {
    // Another plugin's schema: its fields as they come, layers one per line.
    for (const auto& [key, value] : p.items()) {
      if (key == "layers" && value.is_array()) {
        out << "per layer:\n";
        for (const auto& layer : value) {
          out << "  layer " << layer.value("layer", -1);
          for (const auto& [k, v] : layer.items())
            if (k != "layer")
              out << ", " << k << ": " << (v.is_string() ? v.get<std::string>() : v.dump());
          out << "\n";
        }
      } else if (value.is_object()) {
        out << key << ":\n";
        for (const auto& [k, v] : value.items())
          out << "  " << k << ": " << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
      } else {
        out << key << ": " << (value.is_string() ? value.get<std::string>() : value.dump()) << "\n";
      }
    }
    return 0;
  }
  out << "dtype " << p["dtype"].get<std::string>() << ", threads " << p["threads"]
      << ", chunk size " << p["chunk_size"]
      << (p["chunk_size_automatic"].get<bool>() ? " (automatic)" : "") << ", memory estimate "
      << std::fixed << std::setprecision(1)
      << p["memory_estimate_bytes"].get<double>() / (1024.0 * 1024.0)
      << " MiB, prefix reuse: " << p["prefix_reuse"].get<std::string>() << "\n";
  if (w.subspace && p.contains("subspace_projections"))
    out << "subspace directions x B^T: " << p["subspace_projections"].get<std::string>() << "\n";
  out << "candidates per path: " << p["last_call_candidates_per_path"].dump() << "\n\n";
  out << "per layer (particles whose first moved coordinate is in the layer):\n";
  for (const auto& layer : p["layers"]) {
    out << "  layer " << layer["layer"] << " " << layer["kind"].get<std::string>() << " (runs as "
        << layer["runs_as"].get<std::string>() << ", " << layer["parameters"] << " parameters)";
    if (layer["kink_tables"].get<bool>()) out << ", ReLU kink tables built for what follows";
    out << "\n";
    if (layer.contains("contract_not_trusted"))
      out << "    declared contract not trusted: "
          << layer["contract_not_trusted"].get<std::string>() << "\n";
    if (layer.contains("site_local"))
      out << "    site-local path: " << layer["site_local"].get<std::string>() << "\n";
    for (const auto& [path, count] : layer["candidates_starting_here"].items())
      out << "    " << path << ": " << count << " candidates\n";
    for (const auto& why : layer["declined"])
      out << "    declined for " << why["candidates"]
          << " candidates: " << why["why"].get<std::string>() << "\n";
  }
  out << "\npaths:\n";
  for (const auto& [path, what] : p["paths"].items())
    out << "  " << path << ": " << what.get<std::string>() << "\n";
  return 0;
}

}  // namespace

Command explain_command() {
  Command c;
  c.name = "explain";
  c.summary = "show which evaluation path each layer's candidates take, and why";
  c.description =
      "Builds the evaluator for a model, scores one step's candidates on a random batch, and\n"
      "prints per layer the paths taken, why faster paths declined (including layer contracts\n"
      "that failed their probe), the chunk size and the memory estimate.\n\n"
      "examples:\n"
      "  polyprobe explain examples/models/sign_mlp.json\n"
      "  polyprobe explain --workload mlp256-full --threads 1\n"
      "  polyprobe explain --workload mlp256-sub512 --path dense --json";
  c.options = [](po::options_description& o, po::positional_options_description& p) {
    add_backend_options(o);
    o.add_options()("model", po::value<std::string>()->value_name("MODEL.json"), "the model file")(
        "workload", po::value<std::string>()->default_value(""),
        "a reference workload instead of a model file (mlp64-full, mlp256-full, mlp256-sub512, "
        "mnist128-sub256, mnist64-full)")("batch", po::value<int64_t>()->default_value(32),
                                          "rows of the random batch (model files)")(
        "d", po::value<int32_t>()->default_value(2), "particle dimension (model files)")(
        "path", po::value<std::string>()->default_value(""),
        "force a path (auto, sparse, subspace-delta, site-local, dense, inplace, fallback)")(
        "chunk-size", po::value<int64_t>()->default_value(0),
        "candidates held at once (0 = automatic)")("json", po::bool_switch(), "print the raw JSON");
    p.add("model", 1);
  };
  c.run = [](Context& ctx) {
    ctx.json = ctx.vm["json"].as<bool>();
    return run(ctx);
  };
  return c;
}

}  // namespace polyprobe::app
