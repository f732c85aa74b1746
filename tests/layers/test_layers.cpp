// Layer behaviour beyond PyTorch parity: declared contracts hold, forward is safe from many
// threads at once, and bad attributes or shapes are errors that say what to fix.
#include <polyprobe/error.hpp>
#include <polyprobe/model.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <thread>

namespace polyprobe {
namespace {

using nlohmann::json;

std::shared_ptr<const Layer> make(const std::string& kind, const json& attrs, Shape input) {
  static const LayerFactory factory = LayerFactory::with_builtins();
  return factory.create(kind, attrs, input);
}

Matrix<double> random_matrix(Eigen::Index rows, Eigen::Index cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  Matrix<double> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

std::vector<double> initial_params(const Layer& layer, uint64_t seed) {
  std::vector<double> p(static_cast<std::size_t>(layer.parameter_count()));
  std::mt19937_64 rng(seed);
  layer.initialize(p, rng);
  return p;
}

Matrix<double> run(const Layer& layer, const Matrix<double>& x, const std::vector<double>& p) {
  Matrix<double> y(x.rows(), layer.output_shape().numel());
  layer.forward(x, p, y);
  return y;
}

}  // namespace

TEST_CASE("elementwise declarations hold: y(i) == f(x(i))", "[layers][contract]") {
  const std::vector<std::pair<std::string, json>> kinds = {
      {"relu", {}},   {"sign", {}}, {"staircase", {{"step", 0.5}}},
      {"gelu", {}},   {"tanh", {}}, {"lif", {{"steps", 6}, {"threshold", 0.4}}},
      {"flatten", {}}};
  for (const auto& [kind, attrs] : kinds) {
    DYNAMIC_SECTION(kind) {
      const auto layer = make(kind, attrs, Shape{{3, 5}});
      const LayerContract c = layer->contract();
      REQUIRE(c.elementwise);
      REQUIRE(c.elementwise_fn);
      CHECK(layer->parameter_count() == 0);
      const Matrix<double> x = random_matrix(7, 15, 1);
      const Matrix<double> y = run(*layer, x, {});
      for (Eigen::Index i = 0; i < x.size(); ++i)
        CHECK(y.data()[i] == Approx(c.elementwise_fn(x.data()[i])).margin(1e-12));
    }
  }
}

TEST_CASE("the LIF layer fires at the rate its dynamics give", "[layers][lif]") {
  const auto layer = make("lif", {{"steps", 4}, {"beta", 1.0}, {"threshold", 1.0}}, Shape{{3}});
  Matrix<double> x(1, 3);
  x << 0.0, 0.5, 1.0;  // never, every other step, every step
  const Matrix<double> y = run(*layer, x, {});
  CHECK(y(0, 0) == 0.0);
  CHECK(y(0, 1) == 0.5);
  CHECK(y(0, 2) == 1.0);
}

TEST_CASE("forward is const and gives the same result from many threads", "[layers][threads]") {
  const std::vector<std::tuple<std::string, json, Shape>> cases = {
      {"conv2d", {{"out_channels", 3}, {"kernel_size", 3}, {"padding", 1}}, Shape{{2, 6, 6}}},
      {"self_attention", {{"num_heads", 2}}, Shape{{5, 8}}},
      {"self_attention", {{"num_heads", 2}, {"attention", "argmax"}}, Shape{{5, 8}}},
      {"self_attention", {{"num_heads", 2}, {"causal", true}}, Shape{{5, 8}}},
      {"moe", {{"num_experts", 3}}, Shape{{6}}},
      {"cheri_block", {{"dilation", 2}}, Shape{{9, 4}}},
      {"layer_norm", {}, Shape{{4, 6}}},
      {"max_pool2d", {{"kernel_size", 2}}, Shape{{2, 6, 6}}}};
  for (const auto& [kind, attrs, shape] : cases) {
    DYNAMIC_SECTION(kind << " " << attrs.dump()) {
      const auto layer = make(kind, attrs, shape);
      const auto params = initial_params(*layer, 3);
      const Matrix<double> x = random_matrix(8, shape.numel(), 4);
      const Matrix<double> expected = run(*layer, x, params);
      std::vector<Matrix<double>> results(4);
      std::vector<std::thread> threads;
      for (std::size_t t = 0; t < results.size(); ++t)
        threads.emplace_back([&, t] {
          for (int repeat = 0; repeat < 20; ++repeat) results[t] = run(*layer, x, params);
        });
      for (auto& thread : threads) thread.join();
      for (const auto& r : results) CHECK(r == expected);
    }
  }
}

TEST_CASE("causal self-attention: position i depends on positions j <= i only",
          "[layers][attention]") {
  for (const std::string weighting : {"softmax", "argmax"}) {
    INFO(weighting);
    const int64_t len = 6, embed = 8;
    const auto causal =
        make("self_attention", {{"num_heads", 2}, {"attention", weighting}, {"causal", true}},
             Shape{{len, embed}});
    const auto full =
        make("self_attention", {{"num_heads", 2}, {"attention", weighting}}, Shape{{len, embed}});
    CHECK(causal->attributes().at("causal") == true);
    CHECK(full->attributes().at("causal") == false);
    const auto params = initial_params(*causal, 3);
    const Matrix<double> x = random_matrix(3, len * embed, 4);
    for (int64_t moved = 0; moved < len; ++moved) {
      Matrix<double> bent = x;  // position `moved` changed in every sample
      bent.middleCols(moved * embed, embed).array() += 1.5;
      const Matrix<double> before = run(*causal, x, params), after = run(*causal, bent, params);
      for (int64_t i = 0; i < len; ++i) {
        INFO("moved position " << moved << ", output position " << i);
        const double change =
            (after.middleCols(i * embed, embed) - before.middleCols(i * embed, embed))
                .cwiseAbs()
                .maxCoeff();
        if (i < moved)
          CHECK(change == 0.0);
        else if (i == moved && (weighting == "softmax" || i == 0))
          CHECK(change > 0.0);  // its own query and value moved (argmax may pick another)
      }
    }
    // Position 0 sees only itself: its mix is its own value, so the causal layer differs from
    // the full one there (the full layer mixes in the later positions).
    const Matrix<double> yc = run(*causal, x, params), yf = run(*full, x, params);
    CHECK((yc - yf).cwiseAbs().maxCoeff() > 1e-6);
    CHECK((yc.rightCols(embed) - yf.rightCols(embed)).cwiseAbs().maxCoeff() == 0.0);
  }
}

// Pooling by its definition: every window scanned tap by tap, padding skipped (max) or
// counted as zeros (average), NaN anywhere in a max window giving NaN.
Matrix<double> pool_by_definition(const Matrix<double>& x, int64_t channels, int64_t h, int64_t w,
                                  int64_t k, int64_t stride, int64_t pad, bool max) {
  const int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
  Matrix<double> y(x.rows(), channels * oh * ow);
  for (Eigen::Index b = 0; b < x.rows(); ++b)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t oi = 0; oi < oh; ++oi)
        for (int64_t oj = 0; oj < ow; ++oj) {
          double acc = max ? -std::numeric_limits<double>::infinity() : 0.0;
          for (int64_t ki = 0; ki < k; ++ki)
            for (int64_t kj = 0; kj < k; ++kj) {
              const int64_t i = oi * stride + ki - pad, j = oj * stride + kj - pad;
              if (i < 0 || i >= h || j < 0 || j >= w) continue;
              const double v = x(b, (c * h + i) * w + j);
              acc = max ? (std::isnan(acc) || std::isnan(v) ? NAN : std::max(acc, v)) : acc + v;
            }
          y(b, (c * oh + oi) * ow + oj) = max ? acc : acc / static_cast<double>(k * k);
        }
  return y;
}

TEST_CASE("pooling agrees with its definition on every window form, NaN propagates",
          "[layers][pool]") {
  struct Form {
    int64_t h, w, k, stride, pad;
  };
  // 2 x 2 stride 2 without padding has its own loop; the others the general one.
  const std::vector<Form> forms = {{8, 8, 2, 2, 0}, {7, 9, 2, 2, 0}, {8, 8, 3, 1, 1},
                                   {9, 7, 3, 2, 1}, {6, 6, 2, 1, 1}, {5, 8, 4, 3, 2}};
  for (const Form& f : forms)
    for (const bool max : {true, false}) {
      CAPTURE(f.h, f.w, f.k, f.stride, f.pad, max);
      const int64_t channels = 3;
      const auto layer = make(max ? "max_pool2d" : "avg_pool2d",
                              {{"kernel_size", f.k}, {"stride", f.stride}, {"padding", f.pad}},
                              Shape{{channels, f.h, f.w}});
      Matrix<double> x = random_matrix(5, channels * f.h * f.w, 17);
      x(1, 4) = NAN;
      x(3, x.cols() - 1) = NAN;
      const Matrix<double> want =
          pool_by_definition(x, channels, f.h, f.w, f.k, f.stride, f.pad, max);
      const Matrix<double> got = run(*layer, x, {});
      REQUIRE(got.cols() == want.cols());
      Matrix<float> xf = x.cast<float>(), yf(x.rows(), want.cols());
      layer->forward(xf, {}, yf);
      for (Eigen::Index i = 0; i < want.size(); ++i) {
        const double a = want.data()[i];
        if (std::isnan(a)) {
          REQUIRE(std::isnan(got.data()[i]));
          REQUIRE(std::isnan(yf.data()[i]));
        } else {
          REQUIRE(got.data()[i] == Approx(a).margin(1e-12));
          REQUIRE(yf.data()[i] == Approx(a).epsilon(1e-6).margin(1e-6));
        }
      }
      if (max) REQUIRE(got.array().isNaN().count() > 0);
    }
}

TEST_CASE("parameters carry PyTorch's names and shapes", "[layers][names]") {
  Model model(Shape{{4, 8}});
  const LayerFactory factory = LayerFactory::with_builtins();
  model.add(factory.create("self_attention", {{"num_heads", 2}}, model.output_shape()));
  model.add(factory.create("moe", {{"num_experts", 2}}, model.output_shape()));
  model.add(factory.create("cheri_block", {}, model.output_shape()));
  std::vector<std::string> names;
  for (const auto& e : model.parameter_entries()) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"0.in_proj_weight", "0.in_proj_bias", "0.out_proj.weight",
                                          "0.out_proj.bias", "1.router.weight", "1.router.bias",
                                          "1.experts.0.weight", "1.experts.0.bias",
                                          "1.experts.1.weight", "1.experts.1.bias", "2.conv_weight",
                                          "2.fc1.weight", "2.fc2.weight"});
  CHECK(model.parameter_entries()[0].shape == std::vector<int64_t>{24, 8});
  model.initialize(7);
  for (double p : model.parameters()) CHECK(std::isfinite(p));
}

TEST_CASE("layer norm starts as the identity affine map", "[layers][init]") {
  const auto layer = make("layer_norm", {}, Shape{{3, 4}});
  const auto params = initial_params(*layer, 1);
  CHECK(params == std::vector<double>{1, 1, 1, 1, 0, 0, 0, 0});
}

TEST_CASE("bad layer attributes are errors that say what to fix", "[layers][errors]") {
  const auto fails = [](const std::string& kind, const json& attrs, Shape shape,
                        const std::string& needle) {
    INFO(kind << " " << attrs.dump() << " on " << shape.str());
    CHECK_THROWS_WITH(make(kind, attrs, shape), Catch::Contains(needle));
  };
  fails("conv2d", {{"out_channels", 4}, {"kernel_size", 3}, {"groups", 3}}, Shape{{4, 8, 8}},
        "groups");
  fails("conv2d", {{"out_channels", 4}, {"kernel_size", 9}}, Shape{{1, 8, 8}}, "larger than");
  fails("conv2d", {{"out_channels", 4}, {"kernel_size", 3}}, Shape{{8, 8}}, "[C, H, W]");
  fails("conv1d", {{"out_channels", 4}}, Shape{{2, 8}}, "kernel_size");
  fails("conv1d", {{"out_channels", 4}, {"kernel_size", "3"}}, Shape{{2, 8}}, "integer");
  fails("conv1d", {{"out_channels", 4}, {"kernel_size", 3}, {"strid", 2}}, Shape{{2, 8}},
        "unknown attribute 'strid'");
  fails("self_attention", {{"num_heads", 3}}, Shape{{4, 8}}, "divide");
  fails("self_attention", {{"num_heads", 2}, {"attention", "hard"}}, Shape{{4, 8}}, "argmax");
  fails("self_attention", {{"num_heads", 2}, {"causal", 1}}, Shape{{4, 8}},
        "attribute 'causal' has the wrong type (1)");
  fails("self_attention", {{"num_heads", 2}, {"casual", true}}, Shape{{4, 8}},
        "unknown attribute 'casual'");
  fails("layer_norm", {{"normalized_dims", 3}}, Shape{{4, 8}}, "normalized_dims");
  fails("moe", {{"num_experts", 0}}, Shape{{4}}, "num_experts");
  fails("lif", {{"beta", 2.0}}, Shape{{4}}, "beta");
  fails("cheri_block", {}, Shape{{4}}, "[L, C]");
  fails("max_pool2d", {{"kernel_size", 2}, {"padding", 2}}, Shape{{1, 8, 8}}, "padding");
  fails("linear", {{"out_features", -1}}, Shape{{4}}, "out_features");
}

TEST_CASE("a model whose layer shapes do not chain is refused", "[layers][errors]") {
  Model model(Shape{{1, 8, 8}});
  const LayerFactory factory = LayerFactory::with_builtins();
  model.add(factory.create("flatten", {}, model.output_shape()));
  const auto conv =
      factory.create("conv2d", {{"out_channels", 2}, {"kernel_size", 3}}, Shape{{1, 8, 8}});
  CHECK_THROWS_WITH(model.add(conv), Catch::Contains("expects input [1, 8, 8]"));
}

}  // namespace polyprobe
