// The cuda plugin's evaluator sessions against the core's float64 reference: random MLPs
// (every built-in activation, sign and int8 weights, every loss with l2), full space and
// rank-one subspaces, through the stateless calls, the polytope form of score() and a whole
// PolytopeOptimizer trajectory. Needs a CUDA device; without one each case says why and
// exits with 77 (ctest: skipped), except the load test, which must pass anywhere.
#include <polyprobe/plugin/abi.h>
#include <polyprobe/accumulator.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/layer.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/registry.hpp>
#include <polyprobe/subspaces.hpp>

#include "cuda/cuda_backends.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>

using namespace polyprobe;
using polyprobe::testing::backends;
using polyprobe::testing::require_device;

namespace {

struct Case {
  Model model;
  std::unique_ptr<Loss> loss;
  Batch batch;
  std::string description;
};

// A random MLP; `discontinuous` adds sign and staircase activations, sign and int8 weights
// and the 0-1 loss, whose float32 results may legitimately differ from float64. The
// staircase step is a power of two: after it, int8 weights (multiples of 1/64) make logits
// that tie exactly, and only exact arithmetic (no rounding in any summation order) makes the
// 0-1 loss of a tie the same for a GEMM and for the reference's dot products.
Case random_case(std::mt19937_64& rng, bool discontinuous, int max_width = 9) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const LayerFactory& f = backends().factory;
  std::vector<nlohmann::json> activations = {{{"kind", "relu"}},
                                             {{"kind", "tanh"}},
                                             {{"kind", "gelu"}},
                                             {{"kind", "gelu"}, {"approximate", "tanh"}},
                                             {{"kind", "identity"}}};
  if (discontinuous)
    activations.insert(activations.end(),
                       {{{"kind", "sign"}}, {{"kind", "staircase"}, {"step", 0.25}}});
  std::vector<std::string> losses = {"cross_entropy", "mse", "hinge"};
  if (discontinuous) losses.push_back("zero_one");

  const int inputs = pick(2, 7), outputs = pick(2, 12), hidden_layers = pick(1, 3);
  Case c{Model(Shape{{inputs}}), nullptr, {}, "in " + std::to_string(inputs)};
  for (int h = 0; h <= hidden_layers; ++h) {
    const bool last = h == hidden_layers;
    nlohmann::json attrs = {{"out_features", last ? outputs : pick(2, max_width)},
                            {"bias", pick(0, 3) != 0}};
    if (discontinuous && pick(0, 2) == 0) attrs["weight_transform"] = pick(0, 1) ? "sign" : "int8";
    c.model.add(f.create("linear", attrs, c.model.output_shape()));
    c.description += " linear" + attrs.dump();
    if (!last) {
      nlohmann::json act =
          activations[static_cast<std::size_t>(pick(0, static_cast<int>(activations.size()) - 1))];
      const std::string kind = act["kind"];
      act.erase("kind");
      c.model.add(f.create(kind, act, c.model.output_shape()));
      c.description += " " + kind + act.dump();
    }
  }
  c.model.initialize(rng());
  const std::string loss =
      losses[static_cast<std::size_t>(pick(0, static_cast<int>(losses.size()) - 1))];
  c.loss = make_loss(loss, pick(0, 1) ? 1e-3 : 0.0);
  c.description += " loss " + loss + " l2 " + std::to_string(c.loss->l2);
  const int rows = pick(1, 40);
  std::normal_distribution<double> normal;
  c.batch.inputs = Matrix<double>::NullaryExpr(rows, inputs, [&] { return normal(rng); });
  if (loss == "mse")
    c.batch.targets.values =
        Matrix<double>::NullaryExpr(rows, outputs, [&] { return normal(rng); });
  else
    for (int r = 0; r < rows; ++r) c.batch.targets.labels.push_back(pick(0, outputs - 1));
  return c;
}

struct Candidates {
  ParticleMap particles;
  std::vector<int64_t> particle;
  std::vector<double> displacement;
  CandidateSet set() const { return {&particles, particle, displacement}; }
};

Candidates random_candidates(std::mt19937_64& rng, int64_t n, int32_t d, int per_particle,
                             double spread = 0.3) {
  Candidates c;
  c.particles = ParticleMap::contiguous(n, d);
  std::normal_distribution<double> normal(0.0, spread);
  for (int64_t p = 0; p < c.particles.count(); ++p)
    for (int k = 0; k < per_particle; ++k) {
      c.particle.push_back(p);
      for (int j = 0; j < d; ++j) c.displacement.push_back(normal(rng));
    }
  return c;
}

double max_relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(std::abs(want[i]), 1e-6));
  return worst;
}

EvaluatorRequest cuda_request(DType dtype, const Subspace* subspace = nullptr, int64_t chunk = 0,
                              std::string path = "") {
  EvaluatorRequest r;
  r.backend = "cuda";
  r.device = "cuda";
  r.options.dtype = dtype;
  r.options.chunk_size = chunk;
  r.subspace = subspace;
  r.path = std::move(path);
  return r;
}

// Losses of the candidates, then of the incumbent.
std::vector<double> run(Evaluator& evaluator, const Case& c, const Candidates& cands) {
  evaluator.register_batch(c.batch);
  std::vector<double> losses(cands.particle.size());
  evaluator.evaluate(c.model.parameters(), cands.set(), losses);
  losses.push_back(evaluator.evaluate_base(c.model.parameters()));
  return losses;
}

std::unique_ptr<HybridSubspace> hybrid_of(const Model& model) {
  HybridSubspace::Options options;
  options.rank = 2;
  return HybridSubspace::from_layout(model.parameter_entries(), model.num_parameters(), options);
}

void check_stateless(DType dtype, bool discontinuous, bool subspace, double tolerance,
                     int64_t chunk = 0, const std::string& path = "", double spread = 0.3) {
  std::mt19937_64 rng((dtype == DType::f32 ? 21 : 22) + (subspace ? 100 : 0) + chunk);
  for (int trial = 0; trial < 30; ++trial) {
    const Case c = random_case(rng, discontinuous);
    const auto space = subspace ? hybrid_of(c.model) : nullptr;
    const int64_t n = subspace ? space->dimension() : c.model.num_parameters();
    const int32_t d = std::uniform_int_distribution<int32_t>(1, subspace ? 8 : 5)(rng);
    const Candidates cands = random_candidates(rng, n, d, d + 1, spread);
    INFO(to_string(dtype) << " trial " << trial << " d " << d << (subspace ? " hybrid" : "")
                          << " path '" << path << "' spread " << spread << ": " << c.description);
    auto reference = make_reference_evaluator(c.model, *c.loss, space.get(), {DType::f64});
    auto cuda = backends().registry.make_evaluator(c.model, *c.loss,
                                                   cuda_request(dtype, space.get(), chunk, path));
    const auto want = run(*reference, c, cands);
    const auto got = run(*cuda, c, cands);
    CHECK(max_relative_error(got, want) <= tolerance);
  }
}

}  // namespace

TEST_CASE("cuda: the plugin loads and declines cleanly without a device", "[cuda]") {
  const PluginInfo* info = backends().cuda();
  REQUIRE(info != nullptr);
  INFO("reason: " << info->reason);
  REQUIRE(info->loaded);
  if (!info->available) {
    CHECK(info->reason.find("no CUDA device") != std::string::npos);
    WARN("cuda plugin unavailable here: " << info->reason);
  }
  bool sparse = false;
  for (const CapabilityInfo& cap : info->capabilities)
    sparse =
        sparse || (cap.component == "evaluator" && cap.name == "sparse" && cap.device == "cuda");
  CHECK(sparse);
}

namespace {

// A third party's layer kind that no backend knows: y = x^2, elementwise, no parameters.
class SquareLayer final : public LayerBase<SquareLayer> {
 public:
  explicit SquareLayer(Shape shape) : shape_(std::move(shape)) {}
  std::string kind() const override { return "third_party_square"; }
  std::vector<ParamSpec> parameters() const override { return {}; }
  const Shape& input_shape() const override { return shape_; }
  const Shape& output_shape() const override { return shape_; }
  void initialize(std::span<double>, std::mt19937_64&) const override {}
  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S>, MatrixRef<S> y) const {
    y = x.array().square().matrix();
  }

 private:
  Shape shape_;
};

}  // namespace

TEST_CASE("cuda: a layer kind with no device implementation is declined by name", "[cuda]") {
  require_device();
  const LayerFactory& f = backends().factory;
  Model model(Shape{{6}});
  model.add(f.create("linear", {{"out_features", 4}}, model.output_shape()));
  model.add(std::make_shared<const SquareLayer>(model.output_shape()));
  model.add(f.create("linear", {{"out_features", 3}}, model.output_shape()));
  model.initialize(1);
  auto loss = make_loss("cross_entropy");
  try {
    backends().registry.make_evaluator(model, *loss, cuda_request(DType::f64));
    FAIL("the cuda backend accepted a layer kind it has no kernel for");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("layer 1 (third_party_square)") != std::string::npos);
  }
}

namespace {

// Models with every layer kind the dense path runs besides linear and activations.
std::vector<Case> layer_kind_cases(std::mt19937_64& rng) {
  const LayerFactory& f = backends().factory;
  using nlohmann::json;
  struct Spec {
    std::vector<int64_t> input;
    std::vector<std::pair<std::string, json>> layers;
    std::string description;
  };
  const std::vector<Spec> specs = {
      {{1, 6, 6},
       {{"conv2d", {{"out_channels", 3}, {"kernel_size", 3}, {"padding", 1}}},
        {"relu", json::object()},
        {"max_pool2d", {{"kernel_size", 2}}},
        {"flatten", json::object()},
        {"linear", {{"out_features", 4}}}},
       "conv2d relu max_pool2d"},
      {{4, 10},
       {{"conv1d",
         {{"out_channels", 6},
          {"kernel_size", 3},
          {"groups", 2},
          {"dilation", 2},
          {"stride", 2},
          {"padding", 1}}},
        {"tanh", json::object()},
        {"avg_pool1d", {{"kernel_size", 2}, {"padding", 1}}},
        {"flatten", json::object()},
        {"linear", {{"out_features", 3}}}},
       "conv1d groups dilation stride, avg_pool1d padded"},
      {{3, 5, 5},
       {{"conv2d", {{"out_channels", 3}, {"kernel_size", 3}, {"groups", 3}, {"bias", false}}},
        {"avg_pool2d", {{"kernel_size", 2}, {"stride", 1}}},
        {"flatten", json::object()},
        {"linear", {{"out_features", 3}}}},
       "depthwise conv2d, avg_pool2d"},
      {{2, 5, 5},
       {{"conv2d", {{"out_channels", 3}, {"kernel_size", 3}, {"stride", 2}, {"padding", 1}}},
        {"gelu", json::object()},
        {"flatten", json::object()},
        {"linear", {{"out_features", 3}}}},
       "conv2d stride 2, gelu, no pooling"},
      {{3, 4},
       {{"layer_norm", {{"normalized_dims", 2}}},
        {"linear", {{"out_features", 5}}},
        {"gelu", json::object()},
        {"layer_norm", {{"elementwise_affine", false}}},
        {"flatten", json::object()},
        {"linear", {{"out_features", 3}}}},
       "layer_norm, per-position linear"},
      {{5},
       {{"linear", {{"out_features", 6}}},
        {"lif", {{"steps", 6}, {"beta", 0.8}}},
        {"linear", {{"out_features", 3}}}},
       "lif"},
      {{3, 4},
       {{"moe", {{"num_experts", 3}, {"out_features", 5}}},
        {"flatten", json::object()},
        {"linear", {{"out_features", 3}}}},
       "moe"},
      {{4, 6},
       {{"self_attention", {{"num_heads", 2}}},
        {"flatten", json::object()},
        {"linear", {{"out_features", 3}}}},
       "self_attention softmax"},
      {{4, 6},
       {{"linear", {{"out_features", 6}}},
        {"self_attention", {{"num_heads", 3}, {"attention", "argmax"}}},
        {"layer_norm", json::object()},
        {"flatten", json::object()},
        {"linear", {{"out_features", 3}}}},
       "per-position linear, self_attention argmax, layer_norm"},
      {{5, 8},
       {{"self_attention", {{"num_heads", 2}, {"causal", true}}},
        {"gelu", json::object()},
        {"self_attention", {{"num_heads", 4}, {"attention", "argmax"}, {"causal", true}}},
        {"flatten", json::object()},
        {"linear", {{"out_features", 3}}}},
       "self_attention causal softmax, causal argmax"},
      {{8, 4},
       {{"cheri_block", json::object()},
        {"flatten", json::object()},
        {"linear", {{"out_features", 3}}}},
       "cheri_block"},
      {{12, 6},
       {{"cheri_block", {{"dilation", 3}, {"expansion", 3}}},
        {"gelu", json::object()},
        {"cheri_block", {{"dilation", 5}, {"expansion", 1}}},
        {"flatten", json::object()},
        {"linear", {{"out_features", 3}}}},
       "cheri_block dilation 3 e 3, gelu, cheri_block dilation 5 e 1"},
      {{10, 8},
       {{"cheri_block", {{"dilation", 2}}},
        {"linear", {{"out_features", 2}}},
        {"flatten", json::object()},
        {"linear", {{"out_features", 3}}}},
       "cheri_block, per-position linear"},
  };
  std::vector<Case> cases;
  for (const Spec& spec : specs) {
    cases.push_back(Case{Model(Shape{spec.input}), nullptr, {}, spec.description});
    Case& c = cases.back();
    c.loss = make_loss("cross_entropy");
    for (const auto& [kind, attrs] : spec.layers)
      c.model.add(f.create(kind, attrs, c.model.output_shape()));
    c.model.initialize(static_cast<uint64_t>(rng() % 1000));
    const int64_t features = c.model.input_shape().numel(), rows = 5;
    c.batch.inputs = Matrix<double>::Random(rows, features);
    for (int64_t r = 0; r < rows; ++r)
      c.batch.targets.labels.push_back(
          static_cast<int64_t>(rng() % static_cast<uint64_t>(c.model.output_shape().numel())));
  }
  return cases;
}

}  // namespace

TEST_CASE("cuda: every layer kind of the dense path agrees with the reference", "[cuda]") {
  require_device();
  std::mt19937_64 rng(77);
  for (const Case& c : layer_kind_cases(rng))
    for (const std::string path : {"auto", "dense", "materialised"})
      for (const DType dtype : {DType::f64, DType::f32})
        for (const double spread : {1e-3, 0.3}) {
          const int64_t n = c.model.num_parameters();
          const int32_t d = std::uniform_int_distribution<int32_t>(1, 4)(rng);
          const Candidates cands = random_candidates(rng, n, d, 2, spread);
          INFO(c.description << " path " << path << " " << to_string(dtype) << " spread " << spread
                             << " d " << d);
          auto reference = make_reference_evaluator(c.model, *c.loss, nullptr, {DType::f64});
          auto cuda = backends().registry.make_evaluator(c.model, *c.loss,
                                                         cuda_request(dtype, nullptr, 0, path));
          const auto want = run(*reference, c, cands);
          const auto got = run(*cuda, c, cands);
          CHECK(max_relative_error(got, want) <= (dtype == DType::f64 ? 1e-12 : 1e-5));
        }
}

TEST_CASE("cuda: the site-local path serves conv, attention, Cheri and linear particles",
          "[cuda]") {
  // Contiguous particles of d <= 4 lie mostly inside one op: the auto path runs those
  // site-local (explain counts them per layer) and must agree with the dense path, which
  // recomputes the whole changed op, and with the reference.
  require_device();
  std::mt19937_64 rng(78);
  std::map<std::string, int64_t> served;  // site-local particles per op kind
  for (const Case& c : layer_kind_cases(rng)) {
    const std::string kinds = c.description;
    if (kinds.find("conv") == std::string::npos && kinds.find("attention") == std::string::npos &&
        kinds.find("cheri") == std::string::npos)
      continue;
    for (const DType dtype : {DType::f64, DType::f32})
      for (const int32_t d : {1, 2, 4}) {
        const Candidates cands = random_candidates(rng, c.model.num_parameters(), d, 3, 0.3);
        INFO(c.description << " " << to_string(dtype) << " d " << d);
        auto reference = make_reference_evaluator(c.model, *c.loss, nullptr, {DType::f64});
        auto site = backends().registry.make_evaluator(c.model, *c.loss, cuda_request(dtype));
        auto dense = backends().registry.make_evaluator(c.model, *c.loss,
                                                        cuda_request(dtype, nullptr, 0, "dense"));
        const auto want = run(*reference, c, cands);
        const auto got = run(*site, c, cands);
        const auto dense_got = run(*dense, c, cands);
        const double tolerance = dtype == DType::f64 ? 1e-12 : 1e-5;
        CHECK(max_relative_error(got, want) <= tolerance);
        CHECK(max_relative_error(got, dense_got) <= tolerance);
        const nlohmann::json layers = site->explain()["plugin"]["layers"];
        INFO(layers.dump());
        for (const nlohmann::json& layer : layers) {
          const std::string op = layer["op"], path = layer["path"];
          if (op != "conv" && op != "self_attention" && op != "cheri_block" && op != "linear")
            continue;
          REQUIRE(path.rfind("site-local for ", 0) == 0);
          served[op] += std::stoll(path.substr(std::string("site-local for ").size()));
        }
        const nlohmann::json forced = dense->explain()["plugin"]["layers"];
        for (const nlohmann::json& layer : forced)
          CHECK(layer["path"].get<std::string>().rfind("site-local", 0) != 0);
      }
  }
  for (const char* op : {"conv", "self_attention", "cheri_block", "linear"}) {
    INFO(op);
    CHECK(served[op] > 0);
  }
}

namespace {

// The plugins of the build tree but attention_sdpa (as if removed from the plugin path): the
// cuda plugin then has no sdpa operation and mixes attention with its own kernel.
PluginRegistry& registry_without_sdpa() {
  static PluginRegistry* r = [] {
    auto* reg = new PluginRegistry();
    for (const auto& entry :
         std::filesystem::directory_iterator(PluginRegistry::executable_plugin_dir()))
      if (entry.path().filename() != "libpolyprobe_attention_sdpa.so")
        reg->load_library(entry.path());
    return reg;
  }();
  return *r;
}

// An attention model: two self_attention layers of `weighting`, causal or not, on [L, 8].
Case attention_case(const std::string& weighting, bool causal, int64_t len, int64_t rows,
                    uint64_t seed) {
  const LayerFactory& f = backends().factory;
  Case c{Model(Shape{{len, 8}}),
         make_loss("cross_entropy", 1e-3),
         {},
         weighting + (causal ? " causal" : "") + " L " + std::to_string(len)};
  using nlohmann::json;
  c.model.add(f.create("self_attention",
                       {{"num_heads", 2}, {"attention", weighting}, {"causal", causal}},
                       c.model.output_shape()));
  c.model.add(f.create("gelu", json::object(), c.model.output_shape()));
  c.model.add(
      f.create("self_attention", {{"num_heads", 4}, {"causal", causal}}, c.model.output_shape()));
  c.model.add(f.create("flatten", json::object(), c.model.output_shape()));
  c.model.add(f.create("linear", {{"out_features", 3}}, c.model.output_shape()));
  c.model.initialize(seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  c.batch.inputs = Matrix<double>::NullaryExpr(rows, len * 8, [&] { return normal(rng); });
  for (int64_t r = 0; r < rows; ++r) c.batch.targets.labels.push_back(r % 3);
  return c;
}

}  // namespace

TEST_CASE("cuda: attention through the sdpa operation and through the plugin's kernel", "[cuda]") {
  require_device();
  const PluginInfo* sdpa = backends().registry.find("attention_sdpa");
  REQUIRE(sdpa != nullptr);
  REQUIRE(sdpa->available);
  REQUIRE(backends().registry.operations().find("sdpa", PP_DEVICE_NAME_CUDA, PP_DTYPE_F32) !=
          nullptr);
  REQUIRE(registry_without_sdpa().operations().find("sdpa", PP_DEVICE_NAME_CUDA, PP_DTYPE_F32) ==
          nullptr);
  std::mt19937_64 rng(31);
  for (const std::string weighting : {"softmax", "argmax"})
    for (const bool causal : {false, true})
      for (const DType dtype : {DType::f64, DType::f32})
        for (const std::string path : {"auto", "dense", "materialised"}) {
          const Case c = attention_case(weighting, causal, 7, 6, rng() % 1000);
          const Candidates cands = random_candidates(rng, c.model.num_parameters(), 2, 2);
          const char* kind = dtype == DType::f64 ? "cuda, float64" : "cuda, float32";
          INFO(c.description << " " << to_string(dtype) << " path " << path);
          auto reference = make_reference_evaluator(c.model, *c.loss, nullptr, {DType::f64});
          const auto want = run(*reference, c, cands);
          const double tolerance = dtype == DType::f64 ? 1e-12 : 1e-5;
          std::vector<double> with;
          for (const bool use_sdpa : {true, false}) {
            PluginRegistry& registry = use_sdpa ? backends().registry : registry_without_sdpa();
            auto cuda =
                registry.make_evaluator(c.model, *c.loss, cuda_request(dtype, nullptr, 0, path));
            const auto got = run(*cuda, c, cands);
            CHECK(max_relative_error(got, want) <= tolerance);
            if (use_sdpa)
              with = got;
            else
              CHECK(max_relative_error(got, with) <= tolerance);
            const nlohmann::json layers = cuda->explain()["plugin"]["layers"];
            INFO(layers.dump());
            for (const std::size_t l : {std::size_t{0}, std::size_t{2}}) {
              const std::string attention = layers.at(l).at("attention").get<std::string>();
              if (use_sdpa)
                CHECK(attention.rfind(std::string("sdpa (") + kind + ") from attention_sdpa", 0) ==
                      0);
              else
                CHECK(attention.rfind(std::string("explicit: the plugin's kernel (no sdpa "
                                                  "operation loaded for ") +
                                          kind + ")",
                                      0) == 0);
            }
            CHECK_FALSE(layers.at(1).contains("attention"));
          }
        }
}

TEST_CASE("cuda: causal attention changes the losses, with or without the sdpa operation",
          "[cuda]") {
  require_device();
  for (const bool use_sdpa : {true, false}) {
    PluginRegistry& registry = use_sdpa ? backends().registry : registry_without_sdpa();
    std::vector<double> full;
    for (const bool causal : {false, true}) {
      const Case c = attention_case("softmax", causal, 6, 5, 17);
      std::mt19937_64 rng(3);
      const Candidates cands = random_candidates(rng, c.model.num_parameters(), 2, 1);
      auto cuda = registry.make_evaluator(c.model, *c.loss, cuda_request(DType::f64));
      const auto got = run(*cuda, c, cands);
      if (!causal) {
        full = got;
        continue;
      }
      double apart = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        apart = std::max(apart, std::abs(got[i] - full[i]));
      INFO((use_sdpa ? "with" : "without") << " sdpa");
      CHECK(apart > 1e-3);
    }
  }
}

TEST_CASE("cuda: a chunk of more attention problems than one sdpa call takes", "[cuda]") {
  require_device();
  // 1100 candidates x 32 samples x 2 heads = 70400 problems in the first layer's call, more
  // than the operation's 65535: the plugin slices the chunk's samples.
  const Case c = attention_case("softmax", true, 3, 32, 9);
  std::mt19937_64 rng(4);
  const Candidates cands = random_candidates(rng, c.model.num_parameters(), 2, 11, 0.1);
  REQUIRE(cands.particle.size() >= 1100);
  auto reference = make_reference_evaluator(c.model, *c.loss, nullptr, {DType::f64});
  const auto want = run(*reference, c, cands);
  for (const bool use_sdpa : {true, false}) {
    PluginRegistry& registry = use_sdpa ? backends().registry : registry_without_sdpa();
    auto cuda = registry.make_evaluator(c.model, *c.loss, cuda_request(DType::f64));
    const auto got = run(*cuda, c, cands);
    const nlohmann::json plugin = cuda->explain()["plugin"];
    INFO((use_sdpa ? "with" : "without") << " sdpa; chunk " << plugin["chunk"].dump());
    CHECK(max_relative_error(got, want) <= 1e-12);
    CHECK((plugin["layers"][0]["attention"].get<std::string>().rfind("sdpa", 0) == 0) == use_sdpa);
  }
}

TEST_CASE("cuda: full space float64 to 1e-12 with discontinuous models", "[cuda]") {
  require_device();
  check_stateless(DType::f64, true, false, 1e-12);
}

TEST_CASE("cuda: full space float32 to 1e-5 on continuous models", "[cuda]") {
  require_device();
  check_stateless(DType::f32, false, false, 1e-5);
}

TEST_CASE("cuda: hybrid subspace float64 to 1e-12 and float32 to 1e-5", "[cuda]") {
  require_device();
  check_stateless(DType::f64, true, true, 1e-12);
  check_stateless(DType::f32, false, true, 1e-5);
}

TEST_CASE("cuda: tiny chunks give the same losses", "[cuda]") {
  require_device();
  check_stateless(DType::f64, true, false, 1e-12, 3);
  check_stateless(DType::f64, false, true, 1e-12, 1);
}

TEST_CASE("cuda: the fused tail and the layered path agree with the reference at every radius",
          "[cuda]") {
  require_device();
  // auto takes the fused tail wherever it applies (models of up to three linear ops here);
  // layered forces every candidate through the layer-by-layer path.
  for (const double spread : {1e-3, 0.3, 3.0}) {
    check_stateless(DType::f64, true, false, 1e-12, 0, "layered", spread);
    check_stateless(DType::f64, true, false, 1e-12, 0, "", spread);
    check_stateless(DType::f64, true, true, 1e-12, 0, "", spread);
    check_stateless(DType::f32, false, true, 1e-5, 0, "", spread);
  }
}

TEST_CASE("cuda: the dense and materialised paths agree with the reference", "[cuda]") {
  require_device();
  // dense: the changed layers' weights materialised per candidate, cuBLAS strided batched
  // GEMM from the first changed layer's input; materialised: every layer from the inputs.
  for (const std::string path : {"dense", "materialised"}) {
    for (const double spread : {1e-3, 0.3, 3.0}) {
      check_stateless(DType::f64, true, false, 1e-12, 0, path, spread);
      check_stateless(DType::f64, true, true, 1e-12, 0, path, spread);
    }
    check_stateless(DType::f32, false, false, 1e-5, 0, path);
    check_stateless(DType::f32, false, true, 1e-5, 0, path);
    check_stateless(DType::f64, true, false, 1e-12, 2, path);  // tiny chunks
  }
}

TEST_CASE("cuda: the polytope form of score and move_incumbent match the host", "[cuda]") {
  require_device();
  std::mt19937_64 rng(7);
  for (const bool subspace : {false, true})
    for (int trial = 0; trial < 6; ++trial) {
      const Case c = random_case(rng, true, 12);
      const auto space = subspace ? hybrid_of(c.model) : nullptr;
      const int64_t n = subspace ? space->dimension() : c.model.num_parameters();
      const int32_t d = 3, V = d + 1, K = 2;
      const ParticleMap particles = ParticleMap::contiguous(n, d);
      const int64_t P = particles.count();
      Matrix<double> polytope = Matrix<double>::Random(V, d);
      std::vector<double> directions(static_cast<std::size_t>(P * V * d));
      std::normal_distribution<double> normal;
      for (double& v : directions) v = normal(rng);
      std::vector<char> active(static_cast<std::size_t>(P));
      for (char& a : active) a = static_cast<char>(rng() % 4 != 0);
      INFO((subspace ? "hybrid " : "full ") << trial << ": " << c.description);

      auto reference = make_reference_evaluator(c.model, *c.loss, space.get(), {DType::f64});
      auto cuda = backends().registry.make_evaluator(c.model, *c.loss,
                                                     cuda_request(DType::f64, space.get()));
      std::vector<double> theta(c.model.parameters().begin(), c.model.parameters().end());
      for (Evaluator* e : {reference.get(), cuda.get()}) {
        e->register_batch(c.batch);
        e->bind_particles(particles, polytope, K);
        e->sync_incumbent(theta);
      }
      for (int step = 0; step < 3; ++step) {
        const PolytopeProbe probe{directions, 0.2 + 0.1 * step, active, {}};
        std::vector<double> want(static_cast<std::size_t>(P * V * K), -1.0), got = want;
        double want_incumbent = 0, got_incumbent = 0;
        reference->score(probe, want, &want_incumbent);
        cuda->score(probe, got, &got_incumbent);
        CHECK(max_relative_error(got, want) <= 1e-12);  // inactive entries stay -1 in both
        CHECK(std::abs(got_incumbent - want_incumbent) <= 1e-12 * std::abs(want_incumbent));
        std::vector<double> moves(static_cast<std::size_t>(P * d));
        for (double& m : moves) m = 0.05 * normal(rng);
        reference->move_incumbent(moves);
        cuda->move_incumbent(moves);
        // The session's device copy is the host's, bit for bit.
        CHECK(cuda->read_incumbent() == reference->read_incumbent());
      }
    }
}

TEST_CASE("cuda: a PolytopeOptimizer trajectory follows the reference's", "[cuda]") {
  require_device();
  std::mt19937_64 rng(31);
  for (const bool subspace : {false, true})
    for (int trial = 0; trial < 3; ++trial) {
      Case c = random_case(rng, false, 16);
      INFO((subspace ? "hybrid " : "full ") << trial << ": " << c.description);
      OptimizerConfig config;
      config.seed = 40 + static_cast<uint64_t>(trial);
      if (trial == 1) config.radius.kind = RadiusModelKind::quadratic;  // the incumbent's loss
      std::vector<std::vector<double>> finals;
      for (const bool use_cuda : {false, true}) {
        Model model = c.model;
        const auto space = subspace ? hybrid_of(model) : nullptr;
        auto evaluator = use_cuda
                             ? backends().registry.make_evaluator(
                                   model, *c.loss, cuda_request(DType::f64, space.get()))
                             : make_reference_evaluator(model, *c.loss, space.get(), {DType::f64});
        PolytopeOptimizer opt(model, config, space.get());
        opt.register_evaluator(*evaluator, c.batch);
        for (int s = 0; s < 10; ++s) opt.step();
        finals.emplace_back(model.parameters().begin(), model.parameters().end());
        if (use_cuda) CHECK(evaluator->read_incumbent() == finals.back());
      }
      double worst = 0;
      for (std::size_t i = 0; i < finals[0].size(); ++i)
        worst = std::max(worst, std::abs(finals[0][i] - finals[1][i]));
      CHECK(worst <= 1e-9);
    }
}

// The transport half of a step on the device (cost matrix, solve, move, quadratic sums)
// against the same cuda evaluator with the host solving it: every solver, cost scaling and
// block strategy, both radius models' paths, full space and a subspace. The losses are the
// same bits on both sides, so the steps agree to the rounding of the solves; and with the
// transport on the device only per-particle data comes down (explain's byte counts).
struct TransportSetting {
  TransportSolver solver;
  CostScaling scaling;
  RadiusModelKind radius;
  BlockStrategy blocks;
  PolytopeKind polytope;
  int32_t probes;
};

const std::vector<TransportSetting>& transport_settings() {
  static const std::vector<TransportSetting> settings = {
      {TransportSolver::sinkhorn, CostScaling::none, RadiusModelKind::quadratic,
       BlockStrategy::monolithic, PolytopeKind::simplex, 1},
      {TransportSolver::sinkhorn, CostScaling::mean, RadiusModelKind::fixed,
       BlockStrategy::per_layer, PolytopeKind::orthoplex, 2},
      {TransportSolver::softmax, CostScaling::min_max, RadiusModelKind::quadratic,
       BlockStrategy::monolithic, PolytopeKind::orthoplex, 1},
      {TransportSolver::greedy, CostScaling::max_cost, RadiusModelKind::fixed,
       BlockStrategy::monolithic, PolytopeKind::simplex, 1},
      {TransportSolver::top_k, CostScaling::none, RadiusModelKind::quadratic,
       BlockStrategy::per_layer, PolytopeKind::cube, 2},
  };
  return settings;
}

// Eight steps of setting `set` on case c, with the transport solved on the host and on the
// device by the same cuda evaluator, agree step by step and in the final parameters.
void check_device_transport(const Case& c, const TransportSetting& set, bool subspace,
                            uint64_t seed) {
  OptimizerConfig config;
  config.seed = seed;
  config.solver = set.solver;
  config.cost_scaling = set.scaling;
  config.radius.kind = set.radius;
  config.blocks = set.blocks;
  config.polytope = set.polytope;
  config.num_probe = set.probes;
  config.particle_dim = 3;
  config.subspace_particle_dim = 4;
  config.top_k = 2;
  config.sinkhorn_tolerance = 1e-12;  // both sides run to the same iteration
  config.sinkhorn_max_iterations = 400;
  std::vector<std::vector<StepInfo>> infos(2);
  std::vector<std::vector<double>> finals;
  std::vector<nlohmann::json> explained;
  for (const bool on_device : {false, true}) {
    Model model = c.model;
    const auto space = subspace ? hybrid_of(model) : nullptr;
    auto evaluator =
        backends().registry.make_evaluator(model, *c.loss, cuda_request(DType::f64, space.get()));
    REQUIRE(evaluator->solves_transport());
    config.device_transport = on_device;
    PolytopeOptimizer opt(model, config, space.get());
    opt.register_evaluator(*evaluator, c.batch);
    for (int step = 0; step < 8; ++step) infos[on_device ? 1 : 0].push_back(opt.step());
    finals.emplace_back(model.parameters().begin(), model.parameters().end());
    explained.push_back(evaluator->explain()["plugin"]);
  }
  for (int step = 0; step < 8; ++step) {
    const StepInfo& host = infos[0][static_cast<std::size_t>(step)];
    const StepInfo& device = infos[1][static_cast<std::size_t>(step)];
    INFO("step " << step);
    CHECK(device.mean_cost == Approx(host.mean_cost).epsilon(1e-9));
    CHECK(device.best_cost == Approx(host.best_cost).epsilon(1e-9));
    CHECK(device.step_radius == Approx(host.step_radius).epsilon(1e-9));
    CHECK(device.move_norm == Approx(host.move_norm).epsilon(1e-7).margin(1e-12));
    CHECK(std::abs(device.transport_iterations - host.transport_iterations) <= 1);
    CHECK(device.transport_converged == host.transport_converged);
    if (set.radius == RadiusModelKind::quadratic)
      CHECK(device.predicted_change == Approx(host.predicted_change).epsilon(1e-6).margin(1e-12));
  }
  double worst = 0;
  for (std::size_t i = 0; i < finals[0].size(); ++i)
    worst = std::max(worst, std::abs(finals[0][i] - finals[1][i]));
  CHECK(worst <= 1e-8);
  // The host-solved steps bring every loss down; the device-solved ones only moves,
  // duals and per-block results.
  const auto candidates = explained[1]["last_candidates"].get<std::size_t>();
  CHECK(explained[0]["device_transports"].get<int64_t>() == 0);
  CHECK(explained[1]["device_transports"].get<int64_t>() == 8);
  CHECK(explained[0]["step_bytes_to_host"].get<std::size_t>() >= 8 * candidates);
  const int32_t d = subspace ? config.subspace_particle_dim : config.particle_dim;
  const std::size_t V = set.polytope == PolytopeKind::simplex     ? static_cast<std::size_t>(d + 1)
                        : set.polytope == PolytopeKind::orthoplex ? static_cast<std::size_t>(2 * d)
                                                                  : std::size_t{1} << d;
  const std::size_t P = candidates / (V * static_cast<std::size_t>(set.probes));
  // Down: f(X) (quadratic), the moves [P d], the row duals [P] (Sinkhorn), then per block
  // its result and column duals [V]: the rest must be a whole number of blocks.
  const bool sinkhorn = set.solver == TransportSolver::sinkhorn;
  const std::size_t fixed = 8 * (P * static_cast<std::size_t>(d) + (sinkhorn ? P : 0) +
                                 (set.radius == RadiusModelKind::quadratic ? 1 : 0));
  const std::size_t per_block = sizeof(pp_transport_block) + (sinkhorn ? 8 * V : 0);
  const auto down = explained[1]["step_bytes_to_host"].get<std::size_t>();
  REQUIRE(down > fixed);
  CHECK((down - fixed) % per_block == 0);
  CHECK((down - fixed) / per_block >= 1);
  CHECK((down - fixed) / per_block <= P);
}

TEST_CASE("cuda: the transport solved on the device follows the host's", "[cuda]") {
  require_device();
  std::mt19937_64 rng(57);
  for (const bool subspace : {false, true})
    for (std::size_t k = 0; k < transport_settings().size(); ++k) {
      const Case c = random_case(rng, false, 12);
      INFO((subspace ? "hybrid " : "full ") << "setting " << k << ": " << c.description);
      check_device_transport(c, transport_settings()[k], subspace, 70 + k);
    }
}

// Particles of d = 2 whose rotations the session draws from the optimizer's stream follow
// the trajectory of the same session sent the host's rotations, bit for bit, and the step
// sends nothing per particle up.
TEST_CASE("cuda: rotations drawn on the device are the host's, bit for bit", "[cuda]") {
  require_device();
  std::mt19937_64 rng(63);
  for (int trial = 0; trial < 6; ++trial) {
    const Case c = random_case(rng, false, 12);
    const TransportSetting& set =
        transport_settings()[static_cast<std::size_t>(trial) % transport_settings().size()];
    INFO("trial " << trial << ": " << c.description);
    OptimizerConfig config;
    config.seed = 400 + static_cast<uint64_t>(trial);
    config.solver = set.solver;
    config.cost_scaling = set.scaling;
    config.radius.kind = set.radius;
    config.blocks = set.blocks;
    config.num_probe = set.probes;
    config.particle_dim = 2;
    std::vector<std::vector<double>> finals;
    std::vector<std::vector<StepInfo>> infos(2);
    std::vector<nlohmann::json> explained;
    for (const bool drawn : {false, true}) {
      Model model = c.model;
      auto evaluator =
          backends().registry.make_evaluator(model, *c.loss, cuda_request(DType::f64, nullptr));
      REQUIRE(evaluator->draws_rotations(2));
      config.device_rotations = drawn;
      PolytopeOptimizer opt(model, config);
      opt.register_evaluator(*evaluator, c.batch);
      for (int step = 0; step < 8; ++step) infos[drawn ? 1 : 0].push_back(opt.step());
      finals.emplace_back(model.parameters().begin(), model.parameters().end());
      explained.push_back(evaluator->explain()["plugin"]);
    }
    for (std::size_t step = 0; step < infos[0].size(); ++step) {
      INFO("step " << step);
      CHECK(infos[1][step].mean_cost == infos[0][step].mean_cost);
      CHECK(infos[1][step].move_norm == infos[0][step].move_norm);
    }
    CHECK(finals[1] == finals[0]);
    const std::size_t P = explained[1]["last_candidates"].get<std::size_t>() /
                          (3 * static_cast<std::size_t>(set.probes));
    CHECK(explained[0]["step_bytes_to_device"].get<std::size_t>() -
              explained[1]["step_bytes_to_device"].get<std::size_t>() ==
          P * 4 * sizeof(double));
  }
}

// A monolithic block of thousands of particles (as a full-space step over every particle
// gives) follows the host's solve too: the sums over many rows in the device's order stay
// within rounding of the host's.
TEST_CASE("cuda: a block of thousands of particles follows the host's solve", "[cuda]") {
  require_device();
  std::mt19937_64 rng(91);
  Case c = random_case(rng, false, 120);
  while (c.model.parameters().size() < 3 * 4096) c = random_case(rng, false, 120);
  for (std::size_t k = 0; k < transport_settings().size(); ++k) {
    INFO("setting " << k << ": " << c.description << ", " << c.model.parameters().size()
                    << " parameters");
    check_device_transport(c, transport_settings()[k], false, 90 + k);
  }
}

TEST_CASE("cuda: explain names the path of every layer", "[cuda]") {
  require_device();
  std::mt19937_64 rng(5);
  const Case c = random_case(rng, false);
  auto cuda = backends().registry.make_evaluator(c.model, *c.loss, cuda_request(DType::f32));
  const nlohmann::json j = cuda->explain();
  INFO(j.dump());
  CHECK(j["plugin"]["path"] == "sparse");
  CHECK(j["plugin"]["layers"].size() == c.model.num_layers());
}

// --- The accumulator component.

namespace {

template <class S>
void check_accumulator(const std::string& strategy, int64_t n_keys, int64_t rows, int64_t width,
                       std::mt19937_64& rng, bool clustered) {
  std::vector<int64_t> keys(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < keys.size(); ++i)
    keys[i] = clustered ? static_cast<int64_t>(i * n_keys / keys.size())
                        : static_cast<int64_t>(rng() % static_cast<uint64_t>(n_keys));
  Matrix<S> values = Matrix<S>::Random(rows, width);
  Matrix<S> start = Matrix<S>::Random(n_keys, width);  // accumulate adds to what out holds
  Matrix<S> want = start, got = start;
  make_reference_accumulator()->accumulate(keys, values, want);
  auto acc = backends().registry.make_accumulator("cuda", strategy, 1);
  acc->accumulate(keys, values, got);
  INFO(strategy << " keys " << n_keys << " rows " << rows << " width " << width
                << (clustered ? " clustered" : " random") << " ran " << acc->last_strategy());
  if (acc->last_strategy() == std::string("segment")) {
    CHECK(got == want);  // owner-computes in input order: the reference's bits
  } else {
    const double scale = 1.0 + static_cast<double>(want.cwiseAbs().maxCoeff());
    const double tolerance = std::is_same_v<S, float> ? 1e-5 : 1e-12;
    CHECK(static_cast<double>((got - want).cwiseAbs().maxCoeff()) / scale <= tolerance);
  }
}

}  // namespace

TEST_CASE("cuda: accumulators agree with the reference", "[cuda]") {
  require_device();
  std::mt19937_64 rng(5);
  for (const std::string strategy : {"scatter", "segment", "auto"})
    for (const int64_t width : {int64_t{1}, int64_t{3}, int64_t{64}, int64_t{100}})
      for (const bool clustered : {false, true}) {
        check_accumulator<float>(strategy, 37, 2000, width, rng, clustered);
        check_accumulator<double>(strategy, 37, 2000, width, rng, clustered);
        check_accumulator<double>(strategy, 5000, 300, width, rng, clustered);  // sparse keys
      }
}

TEST_CASE("cuda: an accumulator refuses a key out of range", "[cuda]") {
  require_device();
  for (const std::string strategy : {"scatter", "segment"}) {
    auto acc = backends().registry.make_accumulator("cuda", strategy, 1);
    std::vector<int64_t> keys = {0, 1, 7};
    Matrix<double> values = Matrix<double>::Ones(3, 2), out = Matrix<double>::Zero(4, 2);
    try {
      acc->accumulate(keys, values, out);
      FAIL("accepted key 7 of 4");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("key 7 of row 2") != std::string::npos);
    }
  }
}

TEST_CASE("cuda: the device benchmark of an accumulator checks itself", "[cuda]") {
  require_device();
  auto acc = backends().registry.make_accumulator("cuda", "scatter", 1);
  const auto j = nlohmann::json::parse(acc->device_benchmark(1000, 62000, 64, true, 3, 9));
  CHECK(j.at("times_ms").size() == 3);
  CHECK(j.at("copy_times_ms").size() == 3);
  CHECK(j.at("max_abs_diff").get<double>() <= 1e-4 * (1 + j.at("max_abs_sum").get<double>()));
  CHECK(j.at("max_abs_sum").get<double>() > 1.0);  // 62 values in [-1, 1) per cell
}

namespace {

// The plugins of the build tree with the factored_correction operation withheld (as
// --no-operation factored_correction does): the cuda plugin projects the subspace's directions
// with its own kernel.
PluginRegistry& registry_without_correction() {
  static PluginRegistry* r = [] {
    auto* reg = new PluginRegistry();
    reg->withhold_operation(PP_OPERATION_FACTORED_CORRECTION);
    reg->load_directories({PluginRegistry::executable_plugin_dir()});
    return reg;
  }();
  return *r;
}

// 64 -> 48 -> relu -> 5, cross-entropy, 300 samples.
Case wide_case(std::mt19937_64& rng) {
  const LayerFactory& f = backends().factory;
  Case c{Model(Shape{{64}}), make_loss("cross_entropy"), {}, "64-48-5, 300 samples"};
  c.model.add(f.create("linear", {{"out_features", 48}}, c.model.output_shape()));
  c.model.add(f.create("relu", nlohmann::json::object(), c.model.output_shape()));
  c.model.add(f.create("linear", {{"out_features", 5}}, c.model.output_shape()));
  c.model.initialize(rng());
  std::normal_distribution<double> normal;
  c.batch.inputs = Matrix<double>::NullaryExpr(300, 64, [&] { return normal(rng); });
  for (int r = 0; r < 300; ++r) c.batch.targets.labels.push_back(static_cast<int64_t>(rng() % 5));
  return c;
}

}  // namespace

TEST_CASE("cuda: a factored subspace through the factored_correction operation and without it",
          "[cuda]") {
  require_device();
  REQUIRE(backends().registry.operations().find(PP_OPERATION_FACTORED_CORRECTION,
                                                PP_DEVICE_NAME_CUDA, PP_DTYPE_F32) != nullptr);
  std::mt19937_64 rng(41);
  int served = 0;
  for (int trial = 0; trial < 24; ++trial) {
    // The last trials are wide: 64 inputs, 300 samples, rank 24 (cuBLAS's GEMM, not a toy).
    const bool wide = trial >= 20;
    const Case c = wide ? wide_case(rng) : random_case(rng, false);
    const int64_t rank = wide ? 24 : static_cast<int64_t>(1 + rng() % 6);
    auto space = backends().registry.make_subspace(c.model, {"factored", rank, 0, rng() % 100});
    const int32_t d = static_cast<int32_t>(1 + rng() % 8);
    const Candidates cands = random_candidates(rng, space->dimension(), d, d + 1, 0.3);
    auto reference = make_reference_evaluator(c.model, *c.loss, space.get(), {DType::f64});
    const auto want = run(*reference, c, cands);
    for (const DType dtype : {DType::f64, DType::f32}) {
      INFO(to_string(dtype) << " trial " << trial << " rank " << rank << " d " << d << ": "
                            << c.description);
      const double tolerance = dtype == DType::f64 ? 1e-12 : 1e-5;
      auto with =
          backends().registry.make_evaluator(c.model, *c.loss, cuda_request(dtype, space.get()));
      auto own = registry_without_correction().make_evaluator(c.model, *c.loss,
                                                              cuda_request(dtype, space.get()));
      CHECK(max_relative_error(run(*with, c, cands), want) <= tolerance);
      CHECK(max_relative_error(run(*own, c, cands), want) <= tolerance);
      const std::string used = with->explain()["plugin"].value("subspace_projections", "");
      const std::string plain = own->explain()["plugin"].value("subspace_projections", "");
      INFO(used << " | " << plain);
      if (used.find("factored_correction from factored_subspace") != std::string::npos) ++served;
      CHECK(plain.find("factored_correction from") == std::string::npos);
    }
  }
  CHECK(served >= 8);  // the wide trials and the small ones of rank 2 or more in a fused tail
}
