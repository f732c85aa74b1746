// Every evaluation path of the cpu_tbb plugin against the core's float64 reference.
#include "cpu_tbb/cpu_tbb_fixture.hpp"

#include <polyprobe/subspaces.hpp>

#include <chrono>

namespace polyprobe::test {
namespace {

using Layers = std::vector<std::pair<std::string, nlohmann::json>>;

double tolerance(DType dtype) { return dtype == DType::f64 ? 1e-12 : 1e-5; }

// 5 -> 6 -> 7 -> 4 with ReLU and tanh: with d = 3 particles straddle rows, tensors, layers.
const Layers kMlp = {{"linear", {{"out_features", 6}}},
                     {"relu", {}},
                     {"linear", {{"out_features", 7}}},
                     {"tanh", {}},
                     {"linear", {{"out_features", 4}}}};

void check_all_paths(const Model& model, const Loss& loss, const Batch& batch,
                     const Candidates& cands, const Subspace* subspace, const char* delta_name) {
  const Run ref =
      run_evaluator(model, loss, batch, cands, request("reference", DType::f64, "", subspace));
  for (const std::string path : {"", "dense", "inplace", "fallback"})
    for (const DType dtype : {DType::f64, DType::f32}) {
      INFO("path " << (path.empty() ? "auto" : path) << ", " << to_string(dtype));
      const Run got =
          run_evaluator(model, loss, batch, cands, request("cpu_tbb", dtype, path, subspace));
      CHECK(max_rel_diff(got.losses, ref.losses) < tolerance(dtype));
      if (path.empty())
        CHECK(candidates_on(got.explain, delta_name) > 0);
      else
        CHECK(candidates_on(got.explain, path) > 0);
    }
}

TEST_CASE("cpu_tbb: every path agrees with the float64 reference (full space)", "[cpu_tbb]") {
  const Model model = make_model(5, kMlp);
  const auto loss = make_loss("cross_entropy", 1e-3);
  const Batch batch = make_batch(model, 9);
  for (const int32_t d : {2, 3}) {
    INFO("d = " << d);
    check_all_paths(model, *loss, batch, make_candidates(model.num_parameters(), d, 3, 0.3),
                    nullptr, "sparse");
  }
}

TEST_CASE("cpu_tbb: effective deltas of transformed weights and step activations", "[cpu_tbb]") {
  const Model model = make_model(
      4,
      {{"linear", {{"out_features", 6}, {"weight_transform", "int8"}, {"quant_step", 0.05}}},
       {"staircase", {{"step", 0.25}}},
       {"linear", {{"out_features", 5}, {"weight_transform", "sign"}, {"bias_transform", "int8"}}},
       {"sign", {}},
       {"linear", {{"out_features", 3}}}});
  const auto loss = make_loss("cross_entropy");
  const Batch batch = make_batch(model, 7);
  check_all_paths(model, *loss, batch, make_candidates(model.num_parameters(), 2, 3, 0.2), nullptr,
                  "sparse");
}

TEST_CASE("cpu_tbb: effective deltas of int4 weights", "[cpu_tbb]") {
  // A step of 0.1 against weights of about +-0.5: candidates cross levels and the +-7 clamp.
  const Model model = make_model(
      4, {{"linear",
           {{"out_features", 6},
            {"weight_transform", "int4"},
            {"bias_transform", "int4"},
            {"quant_step", 0.1}}},
          {"relu", {}},
          {"linear", {{"out_features", 3}, {"weight_transform", "int4"}, {"quant_step", 0.05}}}});
  const auto loss = make_loss("cross_entropy");
  const Batch batch = make_batch(model, 7);
  check_all_paths(model, *loss, batch, make_candidates(model.num_parameters(), 2, 3, 0.2), nullptr,
                  "sparse");
}

TEST_CASE("cpu_tbb: other losses", "[cpu_tbb]") {
  const Model model = make_model(5, kMlp);
  const Candidates cands = make_candidates(model.num_parameters(), 2, 3, 0.3);
  for (const char* name : {"hinge", "zero_one", "mse"}) {
    INFO(name);
    const auto loss = make_loss(name, 1e-2);
    Batch batch = make_batch(model, 6);
    if (!loss->needs_labels()) {
      batch.targets.labels.clear();
      batch.targets.values = Matrix<double>::Random(6, 4);
    }
    const Run ref = run_evaluator(model, *loss, batch, cands, request("reference", DType::f64));
    const Run got = run_evaluator(model, *loss, batch, cands, request("cpu_tbb", DType::f64));
    CHECK(max_rel_diff(got.losses, ref.losses) < 1e-12);
  }
}

TEST_CASE("cpu_tbb: ReLU kink tables are exact on both sides of the kink", "[cpu_tbb]") {
  // Enough layer-0 candidates (4 * 16 + 16 parameters) for the tables of layer 2 to pay.
  const Model model = make_model(4, {{"linear", {{"out_features", 16}}},
                                     {"relu", {}},
                                     {"linear", {{"out_features", 16}}},
                                     {"relu", {}},
                                     {"linear", {{"out_features", 3}}}});
  const auto loss = make_loss("cross_entropy");
  const Batch batch = make_batch(model, 12);
  for (const double scale : {1e-3, 0.05, 1.0}) {
    INFO("displacement scale " << scale);
    const Candidates cands = make_candidates(model.num_parameters(), 2, 3, scale);
    const Run ref = run_evaluator(model, *loss, batch, cands, request("reference", DType::f64));
    for (const DType dtype : {DType::f64, DType::f32}) {
      const Run got = run_evaluator(model, *loss, batch, cands, request("cpu_tbb", dtype));
      CHECK(max_rel_diff(got.losses, ref.losses) < tolerance(dtype));
      CHECK(got.explain["plugin"]["layers"][2]["kink_tables"].get<bool>());
    }
  }
}

TEST_CASE("cpu_tbb: rank-one losses are exact at every radius, full packets of samples",
          "[cpu_tbb]") {
  // A batch of 40 (two full float32 packets and a tail) so the vectorised exact pass of the
  // rank-one logit changes runs: from radii where the cumulant series holds for every
  // sample to radii where most samples are exact and many ReLU units cross their kinks.
  // 10 classes, hidden layers wider than one packet of units (a tail of 4).
  const Model model = make_model(6, {{"linear", {{"out_features", 20}}},
                                     {"relu", {}},
                                     {"linear", {{"out_features", 36}}},
                                     {"relu", {}},
                                     {"linear", {{"out_features", 10}}}});
  const auto loss = make_loss("cross_entropy", 1e-3);
  const Batch batch = make_batch(model, 40);
  for (const double scale : {1e-4, 1e-2, 0.1, 0.3, 1.0, 3.0}) {
    INFO("displacement scale " << scale);
    const Candidates cands = make_candidates(model.num_parameters(), 2, 3, scale);
    const Run ref = run_evaluator(model, *loss, batch, cands, request("reference", DType::f64));
    for (const DType dtype : {DType::f64, DType::f32}) {
      INFO(to_string(dtype));
      const Run got = run_evaluator(model, *loss, batch, cands, request("cpu_tbb", dtype));
      CHECK(max_rel_diff(got.losses, ref.losses) < tolerance(dtype));
      CHECK(got.explain["plugin"]["layers"][2]["kink_tables"].get<bool>());
    }
  }
}

TEST_CASE("cpu_tbb: subspace-delta agrees with the reference (hybrid and factored)", "[cpu_tbb]") {
  const Model model = make_model(5, kMlp);
  const auto loss = make_loss("cross_entropy", 1e-3);
  const Batch batch = make_batch(model, 8);
  HybridSubspace::Options options;
  options.rank = 2;
  options.max_subspace_dim = 40;  // below the natural total: rule (b), fractional ranks
  const auto hybrid =
      HybridSubspace::from_layout(model.parameter_entries(), model.num_parameters(), options);
  // The factored subspace is the plugin factored_subspace's.
  const auto factored = cpu_registry().make_subspace(model, {"factored", 2, 0, 3});
  for (const Subspace* subspace :
       {static_cast<const Subspace*>(hybrid.get()), static_cast<const Subspace*>(factored.get())}) {
    INFO(subspace->kind());
    for (const int32_t d : {3, 8})
      check_all_paths(model, *loss, batch, make_candidates(subspace->dimension(), d, 4, 0.3),
                      subspace, "subspace-delta");
  }
}

TEST_CASE("cpu_tbb: subspace direction tables are exact at every radius (wide next layer)",
          "[cpu_tbb]") {
  // The layer after the ReLU is wider than a packet (24 outputs), so samples whose units
  // cross a kink take the per-unit correction; 9 classes for the narrow one after it.
  const Model model = make_model(6, {{"linear", {{"out_features", 20}}},
                                     {"relu", {}},
                                     {"linear", {{"out_features", 24}}},
                                     {"relu", {}},
                                     {"linear", {{"out_features", 9}}}});
  const auto loss = make_loss("cross_entropy", 1e-3);
  const Batch batch = make_batch(model, 21);
  HybridSubspace::Options options;
  options.rank = 2;
  const auto hybrid =
      HybridSubspace::from_layout(model.parameter_entries(), model.num_parameters(), options);
  for (const double scale : {1e-3, 0.1, 0.3, 1.0, 3.0}) {
    INFO("displacement scale " << scale);
    const Candidates cands = make_candidates(hybrid->dimension(), 8, 4, scale);
    const Run ref = run_evaluator(model, *loss, batch, cands,
                                  request("reference", DType::f64, "", hybrid.get()));
    for (const DType dtype : {DType::f64, DType::f32}) {
      INFO(to_string(dtype));
      const Run got =
          run_evaluator(model, *loss, batch, cands, request("cpu_tbb", dtype, "", hybrid.get()));
      CHECK(max_rel_diff(got.losses, ref.losses) < tolerance(dtype));
      CHECK(candidates_on(got.explain, "subspace-delta") > 0);
    }
  }
}

TEST_CASE("cpu_tbb: results are bit-identical for any thread count", "[cpu_tbb]") {
  const Model model = make_model(4, {{"linear", {{"out_features", 16}}},
                                     {"relu", {}},
                                     {"linear", {{"out_features", 16}}},
                                     {"relu", {}},
                                     {"linear", {{"out_features", 3}}}});
  const auto loss = make_loss("cross_entropy");
  const Batch batch = make_batch(model, 10);
  const Candidates cands = make_candidates(model.num_parameters(), 2, 3, 0.1);
  for (const std::string path : {"", "dense", "inplace"})
    for (const DType dtype : {DType::f32, DType::f64}) {
      INFO("path " << path << ", " << to_string(dtype));
      const Run one =
          run_evaluator(model, *loss, batch, cands, request("cpu_tbb", dtype, path, nullptr, 1));
      for (const int threads : {2, 3}) {
        const Run many = run_evaluator(model, *loss, batch, cands,
                                       request("cpu_tbb", dtype, path, nullptr, threads));
        CHECK(many.losses == one.losses);
      }
    }
}

TEST_CASE("cpu_tbb: small chunks give the same losses", "[cpu_tbb]") {
  const Model model = make_model(5, kMlp);
  const auto loss = make_loss("cross_entropy");
  const Batch batch = make_batch(model, 5);
  const Candidates cands = make_candidates(model.num_parameters(), 2, 5, 0.2);
  const Run ref = run_evaluator(model, *loss, batch, cands, request("reference", DType::f64));
  for (const std::string path : {"", "dense"}) {
    const Run got = run_evaluator(model, *loss, batch, cands,
                                  request("cpu_tbb", DType::f64, path, nullptr, 0, 2));
    CHECK(max_rel_diff(got.losses, ref.losses) < 1e-12);
    CHECK(got.explain["plugin"]["chunk_size"].get<int64_t>() == 2);
  }
}

TEST_CASE("cpu_tbb: the incumbent and padding-only particles", "[cpu_tbb]") {
  const Model model = make_model(5, kMlp);
  const auto loss = make_loss("cross_entropy", 1e-2);
  const Batch batch = make_batch(model, 5);
  auto evaluator = cpu_registry().make_evaluator(model, *loss, request("cpu_tbb", DType::f64));
  evaluator->register_batch(batch);
  CHECK(evaluator->evaluate_base(model.parameters()) ==
        Approx(objective(model, *loss, batch, model.parameters())).epsilon(1e-12));
  Candidates cands;
  cands.particles.d = 2;
  cands.particles.coords = {0, 1, -1, -1};
  cands.particle = {1, 1};
  cands.displacement = {0.5, 0.5, -1.0, 2.0};
  std::vector<double> losses(2);
  evaluator->evaluate(model.parameters(), cands.set(), losses);
  CHECK(losses[0] == Approx(objective(model, *loss, batch, model.parameters())).epsilon(1e-12));
}

TEST_CASE("cpu_tbb: explain gives the last call's time per phase, within the call's own time",
          "[cpu_tbb]") {
  const Model model = make_model(6, kMlp);
  const auto loss = make_loss("cross_entropy", 1e-3);
  const Batch batch = make_batch(model, 16);
  const Candidates cands = make_candidates(model.num_parameters(), 2, 3, 0.3);
  auto evaluator = cpu_registry().make_evaluator(model, *loss, request("cpu_tbb", DType::f32));
  evaluator->register_batch(batch);
  std::vector<double> losses(cands.particle.size());
  const auto start = std::chrono::steady_clock::now();
  evaluator->evaluate(model.parameters(), cands.set(), losses);
  const double call_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const nlohmann::json phases = evaluator->explain()["plugin"]["last_call_ms"];
  INFO(phases.dump());
  double sum = 0;
  for (const char* key : {"incumbent", "plan", "tables", "groups", "inplace"}) {
    REQUIRE(phases.contains(key));
    CHECK(phases[key].get<double>() >= 0);
    sum += phases[key].get<double>();
  }
  CHECK(phases["groups"].get<double>() > 0);  // the candidates were scored in that phase
  CHECK(sum <= call_ms);
}

}  // namespace
}  // namespace polyprobe::test
