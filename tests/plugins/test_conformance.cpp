// Conformance: every loaded evaluator backend against the core's reference evaluator, on
// random models, particles and displacements. A backend that declines a case reports
// "not supported" with its reason instead of failing (after ggml's test-backend-ops).
#include <polyprobe/error.hpp>
#include <polyprobe/layer.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/registry.hpp>
#include <polyprobe/subspaces.hpp>

#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

using namespace polyprobe;

namespace {

struct Backends {
  PluginRegistry registry;
  LayerFactory factory = LayerFactory::with_builtins();
  Backends() {
    registry.load_directories(
        {PluginRegistry::executable_plugin_dir(), POLYPROBE_EXAMPLE_PLUGIN_DIR});
    registry.register_layers(factory);
  }
  // The available plugins with an evaluator on `device` ("cpu"), or on any device but the
  // CPU ("" with device_only); `unavailable` collects why the others on that device are not.
  std::vector<std::pair<std::string, std::string>> evaluator_plugins(
      bool device_only, std::string* unavailable = nullptr) const {
    std::vector<std::pair<std::string, std::string>> found;
    for (const PluginInfo& info : registry.plugins())
      for (const CapabilityInfo& c : info.capabilities) {
        if (c.component != "evaluator" || (c.device == "cpu") == device_only) continue;
        if (info.available) {
          found.emplace_back(info.name, c.device);
        } else if (unavailable != nullptr) {
          *unavailable += (unavailable->empty() ? "" : "; ") + info.name + ": " + info.reason;
        }
        break;
      }
    return found;
  }
  std::vector<std::string> evaluator_plugins() const {
    std::vector<std::string> names;
    for (const auto& [name, device] : evaluator_plugins(false)) names.push_back(name);
    return names;
  }
};

Backends& backends() {
  static Backends b;
  return b;
}

struct Case {
  Model model;
  std::unique_ptr<Loss> loss;
  Batch batch;
  ParticleMap particles;
  std::vector<int64_t> particle;
  std::vector<double> displacement;
  std::string description;
};

// A random MLP with the given activations; `discontinuous` allows sign, staircase and
// transformed weights, whose float32 and float64 results may legitimately differ.
Case random_case(std::mt19937_64& rng, bool discontinuous) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const LayerFactory& f = backends().factory;
  std::vector<std::string> activations = {"relu", "tanh", "gelu", "triangle_wave"};
  if (discontinuous) activations.insert(activations.end(), {"sign", "staircase"});
  std::vector<std::string> losses = {"cross_entropy", "mse", "hinge"};
  if (discontinuous) losses.push_back("zero_one");

  const int inputs = pick(2, 7), outputs = pick(2, 4), hidden_layers = pick(1, 2);
  Case c{Model(Shape{{inputs}}), nullptr, {}, {}, {}, {}, {}};
  c.description = "in " + std::to_string(inputs);
  for (int h = 0; h <= hidden_layers; ++h) {
    const bool last = h == hidden_layers;
    nlohmann::json attrs = {{"out_features", last ? outputs : pick(2, 9)},
                            {"bias", pick(0, 3) != 0}};
    if (discontinuous && pick(0, 2) == 0) attrs["weight_transform"] = pick(0, 1) ? "sign" : "int8";
    c.model.add(f.create("linear", attrs, c.model.output_shape()));
    c.description += " linear" + attrs.dump();
    if (!last) {
      const std::string act =
          activations[static_cast<std::size_t>(pick(0, static_cast<int>(activations.size()) - 1))];
      c.model.add(f.create(act, {}, c.model.output_shape()));
      c.description += " " + act;
    }
  }
  c.model.initialize(rng());
  const std::string loss =
      losses[static_cast<std::size_t>(pick(0, static_cast<int>(losses.size()) - 1))];
  c.loss = make_loss(loss, pick(0, 1) ? 1e-3 : 0.0);
  c.description += " loss " + loss;

  const int rows = pick(1, 9);
  std::normal_distribution<double> normal;
  c.batch.inputs = Matrix<double>::NullaryExpr(rows, inputs, [&] { return normal(rng); });
  if (loss == "mse") {
    c.batch.targets.values =
        Matrix<double>::NullaryExpr(rows, outputs, [&] { return normal(rng); });
  } else {
    for (int r = 0; r < rows; ++r) c.batch.targets.labels.push_back(pick(0, outputs - 1));
  }

  const int d = pick(1, 5), per_particle = (d + 1) * pick(1, 2);
  c.particles = ParticleMap::contiguous(c.model.num_parameters(), d);
  c.description += " d " + std::to_string(d);
  for (int64_t p = 0; p < c.particles.count(); ++p)
    for (int k = 0; k < per_particle; ++k) {
      c.particle.push_back(p);
      for (int j = 0; j < d; ++j) c.displacement.push_back(0.3 * normal(rng));
    }
  return c;
}

double max_relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(std::abs(want[i]), 1e-6));
  return worst;
}

std::vector<double> run(Evaluator& evaluator, const Case& c) {
  evaluator.register_batch(c.batch);
  std::vector<double> losses(c.particle.size());
  evaluator.evaluate(c.model.parameters(), {&c.particles, c.particle, c.displacement}, losses);
  losses.push_back(evaluator.evaluate_base(c.model.parameters()));
  return losses;
}

void check_backend(const std::string& name, DType dtype, bool discontinuous, double tolerance,
                   const std::string& device = "cpu") {
  std::mt19937_64 rng(dtype == DType::f32 ? 11 : 12);
  int supported = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const Case c = random_case(rng, discontinuous);
    INFO(name << " " << to_string(dtype) << " case " << trial << ": " << c.description);
    EvaluatorRequest request;
    request.backend = name;
    request.device = device;
    request.options.dtype = dtype;
    std::unique_ptr<Evaluator> evaluator;
    try {
      evaluator = backends().registry.make_evaluator(c.model, *c.loss, request);
    } catch (const Error& e) {
      WARN(name << ": not supported: " << e.what());
      continue;
    }
    ++supported;
    auto reference = make_reference_evaluator(c.model, *c.loss, nullptr, {DType::f64});
    const auto want = run(*reference, c);
    const auto got = run(*evaluator, c);
    CHECK(max_relative_error(got, want) <= tolerance);
  }
  CHECK(supported > 0);
}

// ---- Every built-in layer kind -----------------------------------------------------------
//
// One small model per layer kind (and weight transform), each loss, in full space and in a
// hybrid subspace, the candidates at train's radii (the default probe radius 2 at the first
// probe of K = 1: displacements of length 1) and at a small one. `rounding_decides` marks
// models whose float32 and float64 results may legitimately differ (a rounding decides a
// sign, a step, a spike, an argmax or a route): they are checked in float64 only.
struct KindCase {
  std::string name;
  std::vector<int64_t> input_shape;
  nlohmann::json layers;
  bool rounding_decides = false;
};

std::vector<KindCase> kind_cases() {
  using J = nlohmann::json;
  return {
      {"linear relu", {5}, J::parse(R"([{"kind":"linear","out_features":6},{"kind":"relu"},
          {"kind":"linear","out_features":3}])")},
      {"gelu tanh identity", {5}, J::parse(R"([{"kind":"linear","out_features":6},
          {"kind":"gelu"},{"kind":"linear","out_features":5},{"kind":"gelu","approximate":"tanh"},
          {"kind":"tanh"},{"kind":"identity"},{"kind":"linear","out_features":3}])")},
      {"sign staircase",
       {5},
       J::parse(R"([{"kind":"linear","out_features":6},{"kind":"sign"},
          {"kind":"linear","out_features":6},{"kind":"staircase","step":0.25},
          {"kind":"linear","out_features":3}])"),
       true},
      {"transformed weights (sign, int8)",
       {5},
       J::parse(R"([{"kind":"linear","out_features":6,
          "weight_transform":"sign"},{"kind":"relu"},{"kind":"linear","out_features":3,
          "weight_transform":"int8","bias_transform":"int8"}])"),
       true},
      {"layer_norm", {4, 3}, J::parse(R"([{"kind":"linear","out_features":4},
          {"kind":"layer_norm"},{"kind":"relu"},{"kind":"flatten"},
          {"kind":"linear","out_features":3}])")},
      {"conv1d, max_pool1d",
       {2, 8},
       J::parse(R"([{"kind":"conv1d","out_channels":3,
          "kernel_size":3,"padding":1,"dilation":1},{"kind":"relu"},
          {"kind":"max_pool1d","kernel_size":2},{"kind":"flatten"},
          {"kind":"linear","out_features":3}])"),
       true},
      {"conv2d depthwise dilated, avg_pool2d", {2, 5, 5}, J::parse(R"([{"kind":"conv2d",
          "out_channels":2,"kernel_size":3,"padding":2,"dilation":2,"groups":2},{"kind":"tanh"},
          {"kind":"avg_pool2d","kernel_size":2},{"kind":"flatten"},
          {"kind":"linear","out_features":3}])")},
      {"self_attention softmax causal", {4, 4}, J::parse(R"([{"kind":"self_attention",
          "num_heads":2,"causal":true},{"kind":"relu"},{"kind":"flatten"},
          {"kind":"linear","out_features":3}])")},
      {"self_attention argmax",
       {4, 4},
       J::parse(R"([{"kind":"self_attention","num_heads":2,
          "attention":"argmax"},{"kind":"flatten"},{"kind":"linear","out_features":3}])"),
       true},
      {"moe",
       {5},
       J::parse(R"([{"kind":"moe","num_experts":3,"out_features":4},{"kind":"relu"},
          {"kind":"linear","out_features":3}])"),
       true},
      {"lif",
       {5},
       J::parse(R"([{"kind":"linear","out_features":6},{"kind":"lif","steps":4},
          {"kind":"linear","out_features":3}])"),
       true},
      {"cheri_block", {6, 4}, J::parse(R"([{"kind":"cheri_block","dilation":2},
          {"kind":"flatten"},{"kind":"linear","out_features":3}])")},
  };
}

struct KindRun {
  int supported = 0, declined = 0;
};

// Every case of kind_cases() on backend `name`: losses of the reference (float64) against
// the backend's, every loss, full space and a hybrid subspace, two radii.
KindRun check_layer_kinds(const std::string& name, DType dtype, double tolerance,
                          const std::string& device) {
  KindRun result;
  const std::vector<std::string> losses = {"cross_entropy", "mse", "hinge", "zero_one"};
  std::mt19937_64 rng(31);
  std::normal_distribution<double> normal;
  for (const KindCase& kc : kind_cases()) {
    if (dtype == DType::f32 && kc.rounding_decides) continue;
    Model model{Shape{kc.input_shape}};
    for (const nlohmann::json& layer : kc.layers) {
      nlohmann::json attrs = layer;
      const std::string kind = attrs["kind"];
      attrs.erase("kind");
      model.add(backends().factory.create(kind, attrs, model.output_shape()));
    }
    model.initialize(rng());
    const int64_t outputs = model.output_shape().numel();
    for (std::size_t l = 0; l < losses.size(); ++l) {
      // zero_one compares rounded outputs: float64 only, like the exact kinds.
      if (dtype == DType::f32 && losses[l] == "zero_one") continue;
      const auto loss = make_loss(losses[l], l % 2 == 0 ? 1e-3 : 0.0);
      Batch batch;
      const int rows = 4;
      batch.inputs = Matrix<double>::NullaryExpr(rows, model.input_shape().numel(),
                                                 [&] { return normal(rng); });
      if (losses[l] == "mse")
        batch.targets.values =
            Matrix<double>::NullaryExpr(rows, outputs, [&] { return normal(rng); });
      else
        for (int r = 0; r < rows; ++r)
          batch.targets.labels.push_back(
              static_cast<int64_t>(rng() % static_cast<uint64_t>(outputs)));
      HybridSubspace::Options hybrid_options;
      hybrid_options.rank = 2;
      const auto hybrid = HybridSubspace::from_layout(model.parameter_entries(),
                                                      model.num_parameters(), hybrid_options);
      for (const Subspace* subspace :
           {static_cast<const Subspace*>(nullptr), static_cast<const Subspace*>(hybrid.get())}) {
        const int32_t d = subspace == nullptr ? 2 : 8;
        const int64_t n = subspace == nullptr ? model.num_parameters() : subspace->dimension();
        Case c{model, nullptr, batch, ParticleMap::contiguous(n, d), {}, {}, {}};
        c.description = kc.name + ", loss " + losses[l] +
                        (subspace == nullptr ? ", full space" : ", hybrid subspace");
        // Three candidates per particle: two at train's first probe radius, one small.
        for (int64_t p = 0; p < c.particles.count(); ++p)
          for (const double radius : {1.0, 1.0, 0.05}) {
            std::vector<double> u(static_cast<std::size_t>(d));
            double norm = 0;
            for (double& x : u) {
              x = normal(rng);
              norm += x * x;
            }
            c.particle.push_back(p);
            for (double x : u) c.displacement.push_back(radius * x / std::sqrt(norm));
          }
        INFO(name << " " << to_string(dtype) << ": " << c.description);
        EvaluatorRequest request;
        request.backend = name;
        request.device = device;
        request.options.dtype = dtype;
        request.subspace = subspace;
        std::unique_ptr<Evaluator> evaluator;
        try {
          evaluator = backends().registry.make_evaluator(c.model, *loss, request);
        } catch (const Error& e) {
          WARN(name << ": not supported: " << c.description << ": " << e.what());
          ++result.declined;
          continue;
        }
        ++result.supported;
        auto reference = make_reference_evaluator(c.model, *loss, subspace, {DType::f64});
        const auto want = run(*reference, c);
        const auto got = run(*evaluator, c);
        CHECK(max_relative_error(got, want) <= tolerance);
      }
    }
  }
  return result;
}
}  // namespace

TEST_CASE("the core's reference evaluator materialises exactly what it is asked") {
  std::mt19937_64 rng(3);
  const Case c = random_case(rng, true);
  auto reference = make_reference_evaluator(c.model, *c.loss, nullptr, {DType::f64});
  const auto losses = run(*reference, c);
  for (std::size_t i = 0; i < c.particle.size(); i += 7) {
    std::vector<double> params(c.model.parameters().begin(), c.model.parameters().end());
    const auto coords = c.particles.particle(c.particle[i]);
    for (int j = 0; j < c.particles.d; ++j)
      if (coords[static_cast<std::size_t>(j)] >= 0)
        params[static_cast<std::size_t>(coords[static_cast<std::size_t>(j)])] +=
            c.displacement[i * static_cast<std::size_t>(c.particles.d) +
                           static_cast<std::size_t>(j)];
    CHECK(losses[i] == objective(c.model, *c.loss, c.batch, params, DType::f64));
  }
}

TEST_CASE("every cpu evaluator backend agrees with the reference") {
  const auto names = backends().evaluator_plugins();
  REQUIRE_FALSE(names.empty());  // at least cpu_tbb is built with the tests
  for (const std::string& name : names) {
    SECTION(name + " float64, discontinuous models too, to 1e-12") {
      check_backend(name, DType::f64, true, 1e-12);
    }
    SECTION(name + " float32, continuous models, to 1e-5") {
      check_backend(name, DType::f32, false, 1e-5);
    }
  }
}

TEST_CASE("every cpu evaluator backend agrees with the reference on every built-in layer kind") {
  for (const std::string& name : backends().evaluator_plugins()) {
    SECTION(name + " float64, to 1e-9") {
      const KindRun r = check_layer_kinds(name, DType::f64, 1e-9, "cpu");
      INFO(name << ": " << r.supported << " cases served, " << r.declined << " not supported");
      CHECK(r.supported > 0);
    }
    SECTION(name + " float32, the continuous kinds, to 1e-5") {
      const KindRun r = check_layer_kinds(name, DType::f32, 1e-5, "cpu");
      CHECK(r.supported > 0);
    }
  }
}

TEST_CASE("every cpu evaluator backend gives bit-identical losses for any thread count") {
  for (const std::string& name : backends().evaluator_plugins()) {
    std::mt19937_64 rng(5);
    for (int trial = 0; trial < 10; ++trial) {
      const Case c = random_case(rng, true);
      std::vector<double> first;
      for (int threads : {1, 2, 3}) {
        EvaluatorRequest request;
        request.backend = name;
        request.options.dtype = DType::f32;
        request.options.threads = threads;
        auto evaluator = backends().registry.make_evaluator(c.model, *c.loss, request);
        const auto losses = run(*evaluator, c);
        if (first.empty()) first = losses;
        INFO(name << " threads " << threads << ": " << c.description);
        CHECK(losses == first);
      }
    }
  }
}

// y = x * w, one parameter per feature, with the rows split over the threads by the layer's
// own parallel loop, as the self_attention layer's forward does through the sdpa operation.
// Each row sleeps a little, so that other threads take some rows while the caller waits.
class ParallelScale final : public LayerBase<ParallelScale> {
 public:
  explicit ParallelScale(int64_t features) : shape_{{features}} {}
  std::string kind() const override { return "parallel_scale"; }
  std::vector<ParamSpec> parameters() const override { return {{"weight", {shape_.numel()}}}; }
  const Shape& input_shape() const override { return shape_; }
  const Shape& output_shape() const override { return shape_; }
  void initialize(std::span<double> params, std::mt19937_64& rng) const override {
    std::uniform_real_distribution<double> u(0.5, 1.5);
    for (double& p : params) p = u(rng);
  }
  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S> params, MatrixRef<S> y) const {
    tbb::parallel_for(tbb::blocked_range<Eigen::Index>(0, x.rows(), 1), [&](const auto& rows) {
      for (Eigen::Index r = rows.begin(); r != rows.end(); ++r)
        for (Eigen::Index i = 0; i < x.cols(); ++i)
          y(r, i) = x(r, i) * params[static_cast<std::size_t>(i)];
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    });
  }

 private:
  Shape shape_;
};

// A thread of the backend that waits inside a host layer's parallel loop may be handed
// another of the backend's own tasks meanwhile; that task must not share the waiting one's
// working memory. With more threads than cores (global_control lifts TBB's limit of one
// worker per core), every thread count must give the one thread's losses, bit for bit.
TEST_CASE("every cpu evaluator backend keeps its losses when a host layer runs a parallel loop") {
  constexpr int kThreads = 8;
  const tbb::global_control allow(tbb::global_control::max_allowed_parallelism, kThreads);
  const LayerFactory& f = backends().factory;
  Model model{Shape{{4}}};
  model.add(f.create("linear", {{"out_features", 8}}, model.output_shape()));
  model.add(std::make_shared<const ParallelScale>(8));
  model.add(f.create("tanh", {}, model.output_shape()));
  model.add(f.create("linear", {{"out_features", 3}}, model.output_shape()));
  model.initialize(17);
  std::mt19937_64 rng(23);
  std::normal_distribution<double> normal;
  const auto loss = make_loss("cross_entropy", 1e-3);
  const int d = 2;
  Case c{model, nullptr, {}, ParticleMap::contiguous(model.num_parameters(), d), {}, {}, {}};
  c.batch.inputs = Matrix<double>::NullaryExpr(8, 4, [&] { return normal(rng); });
  for (int r = 0; r < 8; ++r) c.batch.targets.labels.push_back(r % 3);
  for (int64_t p = 0; p < c.particles.count(); ++p)
    for (int k = 0; k < 3; ++k) {
      c.particle.push_back(p);
      for (int j = 0; j < d; ++j) c.displacement.push_back(0.3 * normal(rng));
    }
  for (const std::string& name : backends().evaluator_plugins()) {
    std::vector<double> first;
    for (int trial = 0; trial < 20; ++trial) {
      EvaluatorRequest request;
      request.backend = name;
      request.options.dtype = DType::f32;
      request.options.threads = trial == 0 ? 1 : kThreads;
      std::unique_ptr<Evaluator> evaluator;
      try {
        evaluator = backends().registry.make_evaluator(c.model, *loss, request);
      } catch (const Error& e) {
        WARN(name << ": not supported: " << e.what());
        break;
      }
      const auto losses = run(*evaluator, c);
      if (first.empty()) first = losses;
      INFO(name << " trial " << trial);
      CHECK(max_relative_error(losses, first) == 0.0);
    }
  }
}

// A device backend (cuda) runs the same suite when its device is usable, and the optimizer's
// trajectory on it (the transport solved on the device where it offers that) repeats bit for
// bit with the same seed and follows the reference's. Without a device: skipped, saying why.
TEST_CASE("every device evaluator backend agrees with the reference (skipped without a device)") {
  std::string why;
  const auto found = backends().evaluator_plugins(true, &why);
  if (found.empty()) {
    std::fprintf(stderr, "SKIPPED: no usable device evaluator backend (%s)\n",
                 why.empty() ? "none is installed" : why.c_str());
    std::fflush(stderr);
    std::exit(77);
  }
  for (const auto& [name, device] : found) {
    SECTION(name + " float64, discontinuous models too, to 1e-12") {
      check_backend(name, DType::f64, true, 1e-12, device);
    }
    SECTION(name + " float32, continuous models, to 1e-5") {
      check_backend(name, DType::f32, false, 1e-5, device);
    }
    SECTION(name + " every built-in layer kind, float64, to 1e-9") {
      const KindRun r = check_layer_kinds(name, DType::f64, 1e-9, device);
      CHECK(r.supported > 0);
    }
    SECTION(name + ": same seed, same trajectory; the reference's to rounding") {
      std::mt19937_64 rng(9);
      int compared = 0;
      for (int trial = 0; trial < 4; ++trial) {
        Case c = random_case(rng, false);
        INFO(name << " trajectory " << trial << ": " << c.description);
        OptimizerConfig config;
        config.seed = 20 + static_cast<uint64_t>(trial);
        config.radius.kind = trial % 2 == 0 ? RadiusModelKind::quadratic : RadiusModelKind::fixed;
        std::vector<std::vector<double>> finals;
        for (int run = 0; run < 3; ++run) {
          Model model = c.model;
          EvaluatorRequest request;
          request.backend = name;
          request.device = device;
          request.options.dtype = DType::f64;
          std::unique_ptr<Evaluator> evaluator;
          try {
            evaluator = run < 2 ? backends().registry.make_evaluator(model, *c.loss, request)
                                : make_reference_evaluator(model, *c.loss, nullptr, {DType::f64});
          } catch (const Error& e) {
            WARN(name << ": not supported: " << e.what());
            break;
          }
          PolytopeOptimizer opt(model, config);
          opt.register_evaluator(*evaluator, c.batch);
          for (int step = 0; step < 6; ++step) opt.step();
          finals.emplace_back(model.parameters().begin(), model.parameters().end());
        }
        if (finals.size() < 3) continue;
        CHECK(finals[0] == finals[1]);
        CHECK(max_relative_error(finals[0], finals[2]) <= 1e-8);
        ++compared;
      }
      CHECK(compared > 0);
    }
  }
}

// The 0-1 loss with sign weights at the output: rows of equal signs give outputs that tie
// exactly, and a candidate that moves a sign can make two rows equal. The reference
// recomputes the outputs, so a tie stays a tie and the first output wins; a backend must
// not let an incremental change's rounding residue pick another.
TEST_CASE("every cpu evaluator backend keeps exact ties of the 0-1 loss") {
  const LayerFactory& f = backends().factory;
  const auto loss = make_loss("zero_one", 1e-3);
  for (uint64_t seed = 0; seed < 12; ++seed) {
    Model model{Shape{{5}}};
    model.add(f.create("linear", {{"out_features", 7}}, model.output_shape()));
    model.add(f.create("gelu", {}, model.output_shape()));
    model.add(f.create("linear", {{"out_features", 5}}, model.output_shape()));
    model.add(f.create("linear",
                       {{"out_features", 8}, {"bias", false}, {"weight_transform", "sign"}},
                       model.output_shape()));
    model.initialize(seed);
    std::mt19937_64 rng(seed + 100);
    std::normal_distribution<double> normal;
    const int d = 5;
    Case c{model, nullptr, {}, ParticleMap::contiguous(model.num_parameters(), d), {}, {}, {}};
    c.batch.inputs = Matrix<double>::NullaryExpr(40, 5, [&] { return normal(rng); });
    for (int r = 0; r < 40; ++r) c.batch.targets.labels.push_back(r % 8);
    for (int64_t p = 0; p < c.particles.count(); ++p)
      for (int k = 0; k < d + 1; ++k) {
        c.particle.push_back(p);
        for (int j = 0; j < d; ++j) c.displacement.push_back(0.3 * normal(rng));
      }
    for (const std::string& name : backends().evaluator_plugins()) {
      EvaluatorRequest request;
      request.backend = name;
      request.options.dtype = DType::f64;
      auto evaluator = backends().registry.make_evaluator(c.model, *loss, request);
      auto reference = make_reference_evaluator(c.model, *loss, nullptr, {DType::f64});
      INFO(name << " seed " << seed);
      CHECK(max_relative_error(run(*evaluator, c), run(*reference, c)) <= 1e-12);
    }
  }
}
