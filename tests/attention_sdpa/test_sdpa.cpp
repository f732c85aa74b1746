// The attention_sdpa plugin: its "sdpa" operation against a float64 reference on random
// shapes, masks, layouts and argmax ties; bad arguments; the host's self_attention with and
// without the operation; and every evaluator's losses with the plugin on the plugin path and
// removed from it.
#include "attention_sdpa/sdpa_reference.hpp"

#include <polyprobe/evaluator.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/operations.hpp>
#include <polyprobe/registry.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>

namespace polyprobe::test {
namespace {

// The build tree's plugins: all of them, or all but attention_sdpa (as if removed).
const PluginRegistry& registry(bool with_sdpa) {
  auto load = [](bool with) {
    auto* r = new PluginRegistry();
    const std::filesystem::path dir = PluginRegistry::executable_plugin_dir();
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (with || entry.path().filename() != "libpolyprobe_attention_sdpa.so")
        r->load_library(entry.path());
    return r;
  };
  static const PluginRegistry* with = load(true);
  static const PluginRegistry* without = load(false);
  const PluginInfo* info = with->find("attention_sdpa");
  if (info == nullptr || !info->available)
    FAIL("the attention_sdpa plugin is not available in "
         << PluginRegistry::executable_plugin_dir().string()
         << (info ? ": " + info->reason : std::string(": not found"))
         << " (build the attention_sdpa target)");
  return with_sdpa ? *with : *without;
}

const pp_sdpa_table& sdpa(int32_t dtype) {
  const OperationTable::Entry* e =
      registry(true).operations().find("sdpa", PP_DEVICE_NAME_CPU, dtype);
  REQUIRE(e != nullptr);
  CHECK(e->provider == "attention_sdpa");
  return *static_cast<const pp_sdpa_table*>(e->op->table);
}

template <class S>
void check_random_problems(double tolerance) {
  std::mt19937_64 rng(sizeof(S) * 1000 + 7);
  int argmax_with_ties = 0, causal = 0, shared = 0;
  for (int trial = 0; trial < 348; ++trial) {
    // The last trials are long enough for several chunks of keys in the CPU kernel (256), in
    // panels of one and of two vectors of rows (10 to 16 trials each of softmax and argmax
    // with more than 256 keys in two-vector panels, per dtype).
    SdpaProblem<S> p = random_problem<S>(rng, trial < 280 ? 40 : trial < 300 ? 200 : 560);
    pp_sdpa_args& a = p.args;
    a.threads = trial % 2 == 0 ? 1 : 0;
    INFO("trial " << trial << ": b0 " << a.b0 << " b1 " << a.b1 << " heads " << a.heads << " q_len "
                  << a.q_len << " kv_len " << a.kv_len << " head_dim " << a.head_dim << " v_dim "
                  << a.v_dim << " causal " << a.causal
                  << (a.weighting == PP_SDPA_ARGMAX ? " argmax" : " softmax"));
    const std::vector<double> want = reference_sdpa<S>(a);
    pp_error err{};
    REQUIRE(sdpa(a.dtype).run(&a, &err) == PP_OK);
    double worst = 0;
    bool padding_kept = true;
    for (int64_t e = 0; e < static_cast<int64_t>(p.out.size()); ++e) {
      const int64_t in_row = e % a.out_strides[3];
      if (in_row >= a.v_dim) {
        padding_kept = padding_kept && p.out[static_cast<std::size_t>(e)] == S(-7);
        continue;
      }
      const double got = p.out[static_cast<std::size_t>(e)],
                   ref = want[static_cast<std::size_t>(e)];
      worst = std::max(worst, std::abs(got - ref) / std::max(1.0, std::abs(ref)));
    }
    CHECK(worst < tolerance);
    CHECK(padding_kept);
    argmax_with_ties += a.weighting == PP_SDPA_ARGMAX ? 1 : 0;
    causal += a.causal;
    shared += a.k_strides[0] == 0 && a.b0 > 1 ? 1 : 0;
  }
  // The draw covered what it is meant to cover.
  CHECK(argmax_with_ties > 50);
  CHECK(causal > 50);
  CHECK(shared > 30);
}

TEST_CASE("sdpa: float64 matches the reference on random shapes, masks, layouts, ties",
          "[attention_sdpa]") {
  check_random_problems<double>(1e-12);
}

TEST_CASE("sdpa: float32 matches the float64 reference to 1e-5 relative", "[attention_sdpa]") {
  check_random_problems<float>(1e-5);
}

TEST_CASE("sdpa: argmax ties take the first largest key, as the explicit attention",
          "[attention_sdpa]") {
  // Three keys, the last two equal and the largest: every query picks key 1's value.
  const double q[2] = {1.0, 0.5}, k[6] = {0.1, 0.1, 2.0, 1.0, 2.0, 1.0}, v[3] = {10, 20, 30};
  double out = 0;
  pp_sdpa_args a{};
  a.struct_size = sizeof(a);
  a.dtype = PP_DTYPE_F64;
  a.weighting = PP_SDPA_ARGMAX;
  a.b0 = a.b1 = a.heads = 1;
  a.q_len = 1, a.kv_len = 3, a.head_dim = 2, a.v_dim = 1;
  a.scale = 1.0;
  a.q = q, a.k = k, a.v = v, a.out = &out;
  const int64_t qs[4] = {2, 2, 2, 2}, ks[4] = {6, 6, 6, 2}, vs[4] = {3, 3, 3, 1},
                os[4] = {1, 1, 1, 1};
  std::memcpy(a.q_strides, qs, sizeof(qs));
  std::memcpy(a.k_strides, ks, sizeof(ks));
  std::memcpy(a.v_strides, vs, sizeof(vs));
  std::memcpy(a.out_strides, os, sizeof(os));
  pp_error err{};
  REQUIRE(sdpa(PP_DTYPE_F64).run(&a, &err) == PP_OK);
  CHECK(out == 20.0);
  // All scores equal: key 0.
  const double flat[6] = {1, 1, 1, 1, 1, 1};
  a.k = flat;
  REQUIRE(sdpa(PP_DTYPE_F64).run(&a, &err) == PP_OK);
  CHECK(out == 10.0);
}

TEST_CASE("sdpa: bad arguments fail with a reason, never a crash", "[attention_sdpa]") {
  std::mt19937_64 rng(3);
  const pp_sdpa_table& op = sdpa(PP_DTYPE_F64);
  auto fails = [&](auto&& spoil, const std::string& words) {
    SdpaProblem<double> p = random_problem<double>(rng);
    spoil(p.args);
    pp_error err{};
    CHECK(op.run(&p.args, &err) == PP_FAILED);
    CHECK_THAT(std::string(err.message), Catch::Contains(words));
  };
  fails([](pp_sdpa_args& a) { a.heads = 0; }, "must be at least 1");
  fails([](pp_sdpa_args& a) { a.q = nullptr; }, "must all point to data");
  fails([](pp_sdpa_args& a) { a.dtype = PP_DTYPE_I64; }, "float32 and float64 are served");
  fails([](pp_sdpa_args& a) { a.weighting = 5; }, "weighting 5");
  fails([](pp_sdpa_args& a) { a.k_strides[1] = -1; }, "negative");
  fails([](pp_sdpa_args& a) { a.struct_size = 8; }, "rebuild the caller");
  fails(
      [](pp_sdpa_args& a) {
        a.heads = 2;
        a.out_strides[2] = 0;
      },
      "must not broadcast");
  pp_error err{};
  CHECK(op.run(nullptr, &err) == PP_FAILED);
}

using Layers = std::vector<std::pair<std::string, nlohmann::json>>;

Model build(const LayerFactory& factory, const Shape& input, const Layers& layers, DType dtype,
            uint64_t seed) {
  Model model(input, dtype);
  for (const auto& [kind, attrs] : layers)
    model.add(factory.create(kind, attrs, model.output_shape()));
  model.initialize(seed);
  return model;
}

// The explicit factory (no operations) and the one that hands layers the plugin's sdpa.
const LayerFactory& factory(bool with_sdpa) {
  static const LayerFactory explicit_attention = LayerFactory::with_builtins();
  static const LayerFactory fused = [] {
    LayerFactory f = LayerFactory::with_builtins();
    const_cast<PluginRegistry&>(registry(true)).register_layers(f);
    return f;
  }();
  return with_sdpa ? fused : explicit_attention;
}

template <class S>
double max_rel(const Matrix<S>& a, const Matrix<S>& b) {
  double worst = 0;
  for (Eigen::Index i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a.data()[i]) - b.data()[i]) /
                                std::max(1.0, std::abs(static_cast<double>(b.data()[i]))));
  return worst;
}

TEST_CASE("self_attention: the same output with the sdpa operation as explicitly",
          "[attention_sdpa]") {
  REQUIRE(factory(true).operations()->find("sdpa", PP_DEVICE_NAME_CPU, PP_DTYPE_F32) != nullptr);
  REQUIRE(factory(false).operations()->find("sdpa", PP_DEVICE_NAME_CPU, PP_DTYPE_F32) == nullptr);
  std::mt19937_64 rng(11);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t heads = pick(1, 4), len = pick(1, 70), embed = heads * pick(1, 8);
    const std::string weighting = trial % 2 == 0 ? "softmax" : "argmax";
    const bool bias = trial % 3 != 0, causal = trial % 4 >= 2;
    const Layers layers{
        {"self_attention",
         {{"num_heads", heads}, {"attention", weighting}, {"bias", bias}, {"causal", causal}}}};
    INFO("trial " << trial << ": L " << len << " E " << embed << " heads " << heads << " "
                  << weighting << (bias ? "" : " no bias") << (causal ? " causal" : ""));
    const Model plain = build(factory(false), Shape{{len, embed}}, layers, DType::f64, trial);
    const Model fused = build(factory(true), Shape{{len, embed}}, layers, DType::f64, trial);
    Matrix<double> x(pick(1, 5), len * embed);
    std::normal_distribution<double> gauss;
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = gauss(rng);
    if (weighting == "argmax" && len > 2)  // repeated tokens: equal keys, exact ties
      for (Eigen::Index b = 0; b < x.rows(); ++b)
        x.row(b).segment(embed, embed) = x.row(b).segment(0, embed);
    CHECK(max_rel<double>(fused.forward<double>(x), plain.forward<double>(x)) < 1e-12);
    const Matrix<float> xf = x.cast<float>();
    CHECK(max_rel<float>(fused.forward<float>(xf), plain.forward<float>(xf)) < 1e-5);
  }
}

// A sequence model with two attention layers (both causal when `causal`): every
// evaluator's losses with the plugin loaded are those without it, and the causal model's
// differ from the full one's (the mask is applied).
TEST_CASE("attention models: the same losses with attention_sdpa on the plugin path or removed",
          "[attention_sdpa]") {
  for (const std::string weighting : {"softmax", "argmax"})
    for (const DType dtype : {DType::f64, DType::f32}) {
      std::vector<double> full;  // the non-causal model's losses
      for (const bool causal : {false, true}) {
        INFO(weighting << ", " << to_string(dtype) << (causal ? ", causal" : ""));
        const Layers layers{
            {"self_attention", {{"num_heads", 2}, {"attention", weighting}, {"causal", causal}}},
            {"gelu", {}},
            {"self_attention", {{"num_heads", 4}, {"causal", causal}}},
            {"flatten", {}},
            {"linear", {{"out_features", 3}}}};
        std::vector<double> first;
        for (const bool with : {true, false}) {
          const Model model = build(factory(with), Shape{{6, 8}}, layers, dtype, 4);
          const auto loss = make_loss("cross_entropy", 1e-3);
          Batch batch;
          std::mt19937_64 rng(5);
          std::normal_distribution<double> gauss;
          batch.inputs.resize(5, 48);
          for (Eigen::Index i = 0; i < batch.inputs.size(); ++i)
            batch.inputs.data()[i] = gauss(rng);
          for (int r = 0; r < 5; ++r) batch.targets.labels.push_back(r % 3);
          ParticleMap particles = ParticleMap::contiguous(model.num_parameters(), 2);
          std::vector<int64_t> particle;
          std::vector<double> displacement;
          std::normal_distribution<double> step(0.0, 0.2);
          for (int64_t p = 0; p < particles.count(); p += 7)
            for (int v = 0; v < 3; ++v) {
              particle.push_back(p);
              displacement.push_back(step(rng));
              displacement.push_back(step(rng));
            }
          std::vector<double> losses;
          for (const std::string backend : {"reference", "cpu_tbb"}) {
            EvaluatorRequest request;
            request.backend = backend;
            request.options.dtype = dtype;
            auto evaluator = registry(with).make_evaluator(model, *loss, request);
            evaluator->register_batch(batch);
            std::vector<double> got(particle.size());
            evaluator->evaluate(model.parameters(), {&particles, particle, displacement}, got);
            if (first.empty()) first = got;
            const double tol = dtype == DType::f64 ? 1e-10 : 1e-5;
            for (std::size_t i = 0; i < got.size(); ++i)
              CHECK(std::abs(got[i] - first[i]) <= tol * std::max(1.0, std::abs(first[i])));
            if (backend == "cpu_tbb") {
              const std::string dump = evaluator->explain().dump();
              CHECK((dump.find("attention_sdpa") != std::string::npos) == with);
            }
          }
        }
        if (!causal) {
          full = first;
        } else {
          double apart = 0;
          for (std::size_t i = 0; i < first.size(); ++i)
            apart = std::max(apart, std::abs(first[i] - full[i]));
          CHECK(apart > 1e-3);
        }
      }
    }
}

}  // namespace
}  // namespace polyprobe::test
