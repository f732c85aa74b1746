// Layer kinds from a plugin (the example plugin) behave as core layers do.
#include <polyprobe/error.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/registry.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>

using namespace polyprobe;

namespace {

LayerFactory& factory_with_examples() {
  static PluginRegistry registry;
  static LayerFactory factory = [] {
    registry.load_directories({POLYPROBE_EXAMPLE_PLUGIN_DIR});
    LayerFactory f = LayerFactory::with_builtins();
    registry.register_layers(f);
    return f;
  }();
  return factory;
}

double triangle(double x, double period, double amplitude) {
  const double u = x / period;
  return amplitude * (4 * std::abs(u - std::floor(u + 0.5)) - 1);
}

}  // namespace

TEST_CASE("plugin layer kinds join the factory with their provider") {
  const LayerFactory& f = factory_with_examples();
  REQUIRE(f.contains("triangle_wave"));
  REQUIRE(f.contains("feature_scale"));
  CHECK(f.kinds().at("triangle_wave").provider == "example_layers");
}

TEST_CASE("a model mixing core and plugin layers runs forward exactly") {
  const LayerFactory& f = factory_with_examples();
  Model model(Shape{{3}});
  model.add(f.create("linear", {{"out_features", 4}}, model.output_shape()));
  model.add(f.create("triangle_wave", {{"period", 1.5}, {"amplitude", 2.0}}, model.output_shape()));
  model.add(f.create("feature_scale", {}, model.output_shape()));
  model.initialize(7);
  REQUIRE(model.num_parameters() == 3 * 4 + 4 + 4);
  CHECK(model.parameter_entries().back().name == "2.scale");
  // init_params sets every scale to 1.
  for (int i = 0; i < 4; ++i) CHECK(model.parameters()[16 + i] == 1.0);
  for (int i = 0; i < 4; ++i) model.parameters()[16 + i] = 0.5 + i;

  Matrix<double> x(2, 3);
  x << 0.3, -1.2, 2.0, 1.0, 0.0, -0.7;
  const Matrix<double> y = model.forward<double>(x);
  const auto p = model.parameters();
  for (int r = 0; r < 2; ++r)
    for (int o = 0; o < 4; ++o) {
      double z = p[12 + o];
      for (int i = 0; i < 3; ++i) z += x(r, i) * p[o * 3 + i];
      CHECK(y(r, o) == Approx(triangle(z, 1.5, 2.0) * (0.5 + o)).epsilon(1e-14));
    }
  const Matrix<float> yf = model.forward<float>(x.cast<float>());
  CHECK((yf.cast<double>() - y).cwiseAbs().maxCoeff() < 1e-5);

  const LayerContract c = model.layer(1).contract();
  CHECK(c.elementwise);
  REQUIRE(c.elementwise_fn);
  CHECK(c.elementwise_fn(0.25) == Approx(triangle(0.25, 1.5, 2.0)));
  CHECK_FALSE(model.layer(2).contract().elementwise);
}

TEST_CASE("a plugin layer's own errors reach the user with its name") {
  const LayerFactory& f = factory_with_examples();
  CHECK_THROWS_WITH(f.create("triangle_wave", {{"wavelength", 2}}, Shape{{3}}),
                    Catch::Contains("triangle_wave") &&
                        Catch::Contains("unknown attribute 'wavelength'") &&
                        Catch::Contains("plugin example_layers"));
  CHECK_THROWS_WITH(f.create("triangle_wave", {{"period", -1}}, Shape{{3}}),
                    Catch::Contains("positive"));
}

TEST_CASE("a layer kind already provided is skipped with a reason, not replaced") {
  PluginRegistry registry;
  registry.load_directories({POLYPROBE_EXAMPLE_PLUGIN_DIR});
  LayerFactory f = LayerFactory::with_builtins();
  f.add("triangle_wave", {[](const nlohmann::json&, const Shape&) -> std::shared_ptr<const Layer> {
                            throw Error("the core's own");
                          },
                          "pre-existing", "core"});
  registry.register_layers(f);
  CHECK(f.kinds().at("triangle_wave").provider == "core");
  const PluginInfo* info = registry.find("example_layers");
  REQUIRE(info != nullptr);
  CHECK_THAT(info->reason, Catch::Contains("'triangle_wave' skipped"));
  CHECK(f.kinds().at("feature_scale").provider == "example_layers");
}
