// The factored_subspace plugin's "factored_correction" operation (x B^T for a layer's
// subspace directions) on the CPU: against a float64 reference on random shapes and row
// strides, the same bits for any thread count, bad arguments refused; and cpu_tbb's subspace
// path with the operation and with it withheld (--no-operation), both against the core's
// float64 reference evaluator, with --explain saying which projects each layer.
#include "cpu_tbb/cpu_tbb_fixture.hpp"

#include <polyprobe/operations.hpp>

#include <cstring>

namespace polyprobe::test {
namespace {

// The build tree's plugins with the factored_correction operation withheld.
const PluginRegistry& registry_without_correction() {
  static PluginRegistry* registry = [] {
    auto* r = new PluginRegistry();
    r->withhold_operation(PP_OPERATION_FACTORED_CORRECTION);
    r->load_directories({PluginRegistry::executable_plugin_dir()});
    return r;
  }();
  return *registry;
}

const pp_factored_correction_table& correction(int32_t dtype) {
  const OperationTable::Entry* e =
      cpu_registry().operations().find(PP_OPERATION_FACTORED_CORRECTION, PP_DEVICE_NAME_CPU, dtype);
  if (e == nullptr) {
    const PluginInfo* info = cpu_registry().find("factored_subspace");
    FAIL("no CPU factored_correction operation: "
         << (info ? info->reason : std::string("the factored_subspace plugin is not built")));
  }
  CHECK(e->provider == "factored_subspace");
  return *static_cast<const pp_factored_correction_table*>(e->op->table);
}

template <class S>
struct Problem {
  int64_t samples, width, n_dirs, x_stride, dirs_stride, out_stride;
  std::vector<S> x, dirs, out;
  pp_factored_project_args args() {
    pp_factored_project_args a{};
    a.struct_size = sizeof(a);
    a.dtype = sizeof(S) == 4 ? PP_DTYPE_F32 : PP_DTYPE_F64;
    a.samples = samples;
    a.width = width;
    a.n_dirs = n_dirs;
    a.x = x.data();
    a.x_stride = x_stride;
    a.dirs = dirs.data();
    a.dirs_stride = dirs_stride;
    a.out = out.data();
    a.out_stride = out_stride;
    return a;
  }
};

// Random sizes (directions on both sides of the operation's GEMM threshold, samples on both
// sides of its block of 64) and row strides with padding; padding holds -7.
template <class S>
Problem<S> random_problem(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  Problem<S> p;
  p.samples = pick(1, 300);
  p.width = pick(1, 200);
  p.n_dirs = rng() % 3 == 0 ? pick(1, 3) : pick(4, 40);
  p.x_stride = p.width + pick(0, 3);
  p.dirs_stride = p.width + pick(0, 3);
  p.out_stride = p.samples + pick(0, 3);
  std::normal_distribution<double> gauss;
  p.x.assign(static_cast<std::size_t>(p.samples * p.x_stride), S(-7));
  p.dirs.assign(static_cast<std::size_t>(p.n_dirs * p.dirs_stride), S(-7));
  p.out.assign(static_cast<std::size_t>(p.n_dirs * p.out_stride), S(-7));
  for (int64_t b = 0; b < p.samples; ++b)
    for (int64_t i = 0; i < p.width; ++i)
      p.x[static_cast<std::size_t>(b * p.x_stride + i)] = static_cast<S>(gauss(rng));
  for (int64_t j = 0; j < p.n_dirs; ++j)
    for (int64_t i = 0; i < p.width; ++i)
      p.dirs[static_cast<std::size_t>(j * p.dirs_stride + i)] = static_cast<S>(gauss(rng));
  return p;
}

template <class S>
void check_random_problems(double tolerance) {
  const int32_t dtype = sizeof(S) == 4 ? PP_DTYPE_F32 : PP_DTYPE_F64;
  const pp_factored_correction_table& op = correction(dtype);
  std::mt19937_64 rng(sizeof(S) * 31);
  int gemms = 0, products = 0, blocks = 0;
  for (int trial = 0; trial < 120; ++trial) {
    Problem<S> p = random_problem<S>(rng);
    INFO("trial " << trial << ": samples " << p.samples << " width " << p.width << " directions "
                  << p.n_dirs << " strides " << p.x_stride << "/" << p.dirs_stride << "/"
                  << p.out_stride);
    (p.n_dirs >= 4 ? gemms : products) += 1;
    blocks += p.samples > 64 ? 1 : 0;
    pp_factored_project_args a = p.args();
    a.threads = 1;
    pp_error err{};
    REQUIRE(op.project(&a, &err) == PP_OK);
    const std::vector<S> one_thread = p.out;
    a.threads = 0;
    REQUIRE(op.project(&a, &err) == PP_OK);
    CHECK(std::memcmp(one_thread.data(), p.out.data(), p.out.size() * sizeof(S)) == 0);
    double worst = 0;
    bool padding_kept = true;
    for (int64_t j = 0; j < p.n_dirs; ++j) {
      for (int64_t b = 0; b < p.samples; ++b) {
        double want = 0, scale = 0;
        for (int64_t i = 0; i < p.width; ++i) {
          const double term =
              static_cast<double>(p.dirs[static_cast<std::size_t>(j * p.dirs_stride + i)]) *
              static_cast<double>(p.x[static_cast<std::size_t>(b * p.x_stride + i)]);
          want += term;
          scale += std::abs(term);
        }
        const double got = p.out[static_cast<std::size_t>(j * p.out_stride + b)];
        worst = std::max(worst, std::abs(got - want) / std::max(scale, 1e-300));
      }
      for (int64_t b = p.samples; b < p.out_stride; ++b)
        padding_kept =
            padding_kept && p.out[static_cast<std::size_t>(j * p.out_stride + b)] == S(-7);
    }
    CHECK(worst < tolerance);
    CHECK(padding_kept);
  }
  CHECK(gemms > 20);  // both kernels and several blocks of samples were exercised
  CHECK(products > 20);
  CHECK(blocks > 20);
}

TEST_CASE("factored_correction: x B^T against float64 on random shapes and strides",
          "[factored][operation]") {
  SECTION("float32") { check_random_problems<float>(1e-5); }
  SECTION("float64") { check_random_problems<double>(1e-13); }
}

TEST_CASE("factored_correction: bad arguments are refused with the reason",
          "[factored][operation]") {
  const pp_factored_correction_table& op = correction(PP_DTYPE_F32);
  std::mt19937_64 rng(5);
  auto fails = [&](const std::function<void(pp_factored_project_args&)>& spoil,
                   const std::string& reason) {
    Problem<float> p = random_problem<float>(rng);
    pp_factored_project_args a = p.args();
    spoil(a);
    pp_error err{};
    CHECK(op.project(&a, &err) == PP_FAILED);
    INFO(err.message);
    CHECK(std::string(err.message).find(reason) != std::string::npos);
  };
  fails([](auto& a) { a.struct_size = 8; }, "older SDK");
  fails([](auto& a) { a.dtype = PP_DTYPE_I64; }, "float32 or float64");
  fails([](auto& a) { a.x = nullptr; }, "null tensor");
  fails([](auto& a) { a.dirs_stride = a.width - 1; }, "stride shorter");
  fails([](auto& a) { a.n_dirs = -1; }, "negative sizes");
  pp_error err{};
  CHECK(op.project(nullptr, &err) == PP_FAILED);
  // Nothing to compute: no pointer is read.
  pp_factored_project_args empty{};
  empty.struct_size = sizeof(empty);
  empty.dtype = PP_DTYPE_F64;
  empty.width = 3;
  CHECK(op.project(&empty, &err) == PP_OK);
}

TEST_CASE("factored_correction: withheld, the plugin says so and nothing offers it",
          "[factored][operation]") {
  const PluginRegistry& without = registry_without_correction();
  CHECK(without.operations().find(PP_OPERATION_FACTORED_CORRECTION, PP_DEVICE_NAME_CPU,
                                  PP_DTYPE_F32) == nullptr);
  const PluginInfo* info = without.find("factored_subspace");
  REQUIRE(info != nullptr);
  CHECK(info->available);  // the subspace kind stays
  CHECK(info->reason.find("withheld") != std::string::npos);
  const auto offered = without.offered_operations();
  CHECK(std::find(offered.begin(), offered.end(), PP_OPERATION_FACTORED_CORRECTION) !=
        offered.end());
}

// 12 -> 9 -> relu -> 10 -> tanh -> 5: a factored subspace of rank `rank` gives each linear
// layer min(rank, inputs) directions.
TEST_CASE("factored_correction: cpu_tbb's subspace path with and without it equals the reference",
          "[factored][cpu_tbb]") {
  const std::vector<std::pair<std::string, nlohmann::json>> layers = {
      {"linear", {{"out_features", 9}}},
      {"relu", {}},
      {"linear", {{"out_features", 10}}},
      {"tanh", {}},
      {"linear", {{"out_features", 5}}}};
  Model model = make_model(12, layers);
  auto loss = make_loss("cross_entropy");
  const Batch batch = make_batch(model, 70);  // two blocks of the operation's 64 samples
  for (const int64_t rank : {4, 8}) {
    auto subspace = cpu_registry().make_subspace(model, {"factored", rank, 0, 7});
    const Candidates cands = make_candidates(subspace->dimension(), 4, 3, 0.2);
    const Run want = run_evaluator(model, *loss, batch, cands,
                                   request("reference", DType::f64, "", subspace.get()));
    for (const DType dtype : {DType::f32, DType::f64})
      for (const int threads : {1, 0}) {
        INFO("rank " << rank << ", " << (dtype == DType::f32 ? "float32" : "float64") << ", "
                     << threads << " threads");
        const EvaluatorRequest r = request("cpu_tbb", dtype, "", subspace.get(), threads);
        const Run with = run_evaluator(model, *loss, batch, cands, r);
        auto plain = registry_without_correction().make_evaluator(model, *loss, r);
        plain->register_batch(batch);
        std::vector<double> own(cands.particle.size());
        plain->evaluate(model.parameters(), cands.set(), own);
        const double tolerance = dtype == DType::f32 ? 2e-5 : 1e-12;
        CHECK(max_rel_diff(with.losses, want.losses) < tolerance);
        CHECK(max_rel_diff(own, want.losses) < tolerance);
        CHECK(candidates_on(with.explain, "subspace-delta") ==
              static_cast<int64_t>(cands.particle.size()));
        const std::string used = with.explain["plugin"]["subspace_projections"];
        const std::string plain_note = plain->explain()["plugin"]["subspace_projections"];
        INFO(used << " | " << plain_note);
        if (rank >= 8) {
          CHECK(used ==
                "factored_correction from factored_subspace for layers 0 (8 directions), "
                "2 (8 directions), 4 (8 directions)");
        } else {
          CHECK(used.find("no affine layer has 8 or more directions") != std::string::npos);
        }
        CHECK(plain_note.find("no factored_correction operation loaded") != std::string::npos);
      }
  }
}

}  // namespace
}  // namespace polyprobe::test
