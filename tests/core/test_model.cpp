#include <polyprobe/error.hpp>
#include <polyprobe/model.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>

using namespace polyprobe;

TEST_CASE("parameters follow PyTorch's order and names") {
  const LayerFactory f = LayerFactory::with_builtins();
  Model model(Shape{{3}});
  model.add(f.create("linear", {{"out_features", 4}}, model.output_shape()));
  model.add(f.create("relu", {}, model.output_shape()));
  model.add(f.create("linear", {{"out_features", 2}, {"bias", false}}, model.output_shape()));
  const auto& e = model.parameter_entries();
  REQUIRE(e.size() == 3);
  CHECK(e[0].name == "0.weight");
  CHECK(e[0].shape == std::vector<int64_t>{4, 3});
  CHECK(e[0].offset == 0);
  CHECK(e[1].name == "0.bias");
  CHECK(e[1].offset == 12);
  CHECK(e[2].name == "2.weight");
  CHECK(e[2].offset == 16);
  CHECK(model.num_parameters() == 24);
  CHECK(model.layer_offset(2) == 16);
}

TEST_CASE("layers whose shapes do not chain are rejected with both shapes named") {
  const LayerFactory f = LayerFactory::with_builtins();
  Model model(Shape{{3}});
  auto wrong = f.create("relu", {}, Shape{{5}});
  CHECK_THROWS_WITH(model.add(wrong),
                    Catch::Contains("expects input [5]") && Catch::Contains("[3]"));
}

TEST_CASE("the linear forward is x W^T + b, with weight transforms applied") {
  const LayerFactory f = LayerFactory::with_builtins();
  for (const char* transform : {"identity", "sign", "int8"}) {
    INFO(transform);
    Model model(Shape{{2}});
    model.add(f.create("linear",
                       {{"out_features", 2}, {"weight_transform", transform}, {"quant_step", 0.25}},
                       model.output_shape()));
    auto p = model.parameters();
    const double w[4] = {0.3, -0.6, 1.1, 0.0}, b[2] = {0.05, -0.2};
    std::copy(w, w + 4, p.begin());
    std::copy(b, b + 2, p.begin() + 4);
    auto q = [&](double v) {
      if (std::string(transform) == "sign") return v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0);
      if (std::string(transform) == "int8") return std::nearbyint(v / 0.25) * 0.25;
      return v;
    };
    Matrix<double> x(1, 2);
    x << 2.0, -3.0;
    const Matrix<double> y = model.forward<double>(x);
    CHECK(y(0, 0) == Approx(2 * q(0.3) - 3 * q(-0.6) + 0.05));
    CHECK(y(0, 1) == Approx(2 * q(1.1) - 3 * q(0.0) - 0.2));
    const LayerContract c = model.layer(0).contract();
    CHECK(c.affine);
    CHECK(bool(c.weight_transform) == (std::string(transform) != "identity"));
  }
}

TEST_CASE("default initialisation is PyTorch's bound and reproducible") {
  const LayerFactory f = LayerFactory::with_builtins();
  Model a(Shape{{16}}), b(Shape{{16}});
  a.add(f.create("linear", {{"out_features", 8}}, a.output_shape()));
  b.add(f.create("linear", {{"out_features", 8}}, b.output_shape()));
  a.initialize(42);
  b.initialize(42);
  CHECK(std::equal(a.parameters().begin(), a.parameters().end(), b.parameters().begin()));
  for (double p : a.parameters()) CHECK(std::abs(p) <= 0.25);
}

TEST_CASE("elementwise activations compute their formula and declare it") {
  const LayerFactory f = LayerFactory::with_builtins();
  const std::vector<std::pair<std::string, std::function<double(double)>>> cases = {
      {"relu", [](double v) { return std::max(v, 0.0); }},
      {"tanh", [](double v) { return std::tanh(v); }},
      {"sign", [](double v) { return v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0); }},
      {"staircase", [](double v) { return 0.25 * std::floor(v / 0.25); }},
      {"gelu", [](double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }},
  };
  Matrix<double> x(1, 5);
  x << -1.3, -0.2, 0.0, 0.37, 2.2;
  for (const auto& [kind, fn] : cases) {
    INFO(kind);
    auto layer = f.create(kind, {}, Shape{{5}});
    Matrix<double> y(1, 5);
    layer->forward(x, {}, y);
    const LayerContract c = layer->contract();
    REQUIRE(c.elementwise);
    for (int i = 0; i < 5; ++i) {
      CHECK(y(0, i) == Approx(fn(x(0, i))).epsilon(1e-14));
      CHECK(c.elementwise_fn(x(0, i)) == Approx(fn(x(0, i))).epsilon(1e-14));
    }
  }
}

TEST_CASE("bad layer attributes are errors naming the layer and attribute") {
  const LayerFactory f = LayerFactory::with_builtins();
  CHECK_THROWS_WITH(f.create("linear", {{"out_feature", 3}}, Shape{{2}}),
                    Catch::Contains("linear") && Catch::Contains("out_features"));
  CHECK_THROWS_WITH(
      f.create("linear", {{"out_features", 3}, {"weight_transform", "ternary"}}, Shape{{2}}),
      Catch::Contains("unknown transform 'ternary'"));
  CHECK_THROWS_WITH(f.create("linear", {{"out_features", "three"}}, Shape{{2}}),
                    Catch::Contains("wrong type"));
  CHECK_THROWS_WITH(f.create("relu", {{"inplace", true}}, Shape{{2}}),
                    Catch::Contains("unknown attribute 'inplace'"));
  CHECK_THROWS_WITH(f.create("nonexistent", {}, Shape{{2}}),
                    Catch::Contains("unknown layer kind 'nonexistent'"));
}
