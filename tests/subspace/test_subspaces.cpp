// HybridSubspace's allocation rule (bench/README.md, "Subspace") and the maps of the hybrid
// subspace and of the factored one (from the plugin factored_subspace, through the registry).
#include <polyprobe/error.hpp>
#include <polyprobe/layer.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/registry.hpp>
#include <polyprobe/subspaces.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <random>

namespace polyprobe {
namespace {

Model mlp(std::vector<int64_t> sizes) {
  const LayerFactory factory = LayerFactory::with_builtins();
  Model model(Shape{{sizes[0]}});
  for (std::size_t i = 1; i < sizes.size(); ++i) {
    if (i > 1) model.add(factory.create("relu", nlohmann::json::object(), model.output_shape()));
    model.add(factory.create("linear", {{"out_features", sizes[i]}}, model.output_shape()));
  }
  return model;
}

std::vector<int64_t> counts(const std::vector<SubspaceEntry>& entries) {
  std::vector<int64_t> c;
  for (const auto& e : entries) {
    if (e.raw)
      c.push_back(e.coords);
    else {
      c.push_back(e.coords_a);
      c.push_back(e.coords_b);
    }
  }
  return c;
}

TEST_CASE("hybrid allocation, rule (b): mlp256-sub512", "[subspace]") {
  const Model model = mlp({64, 256, 256, 10});
  const auto entries = HybridSubspace::allocate(model.parameter_entries(), 8, 512);
  // W0 141 (113 / 28), b0 14, W1 225 (113 / 112), b1 14, W2 117 (4 / 113), b2 1.
  CHECK(counts(entries) == std::vector<int64_t>{113, 28, 14, 113, 112, 14, 4, 113, 1});
  for (const auto& e : entries)
    if (!e.raw) CHECK(e.rank == 1);
}

TEST_CASE("hybrid allocation, rule (a): mnist128-sub256", "[subspace]") {
  const Model model = mlp({784, 128, 10});
  const auto entries = HybridSubspace::allocate(model.parameter_entries(), 8, 256);
  // W0 102 (14 / 88), b0 128, W1 16 (1 / 15), b1 10.
  CHECK(counts(entries) == std::vector<int64_t>{14, 88, 128, 1, 15, 10});
}

TEST_CASE("hybrid allocation without a budget is the natural layout", "[subspace]") {
  const Model model = mlp({5, 3, 2});
  const auto entries = HybridSubspace::allocate(model.parameter_entries(), 8, 0);
  // rank min(8, 3, 5) = 3: A 3 * 3, B 3 * 5; bias 3; rank 2: A 2 * 2, B 2 * 3; bias 2.
  CHECK(counts(entries) == std::vector<int64_t>{9, 15, 3, 4, 6, 2});
}

void check_map(const RankOneSubspace& s, const Model& model) {
  // apply() of a random theta equals the sum of theta_k u_k v_k^T written out densely.
  std::mt19937_64 rng(5);
  std::normal_distribution<double> gauss;
  std::vector<int64_t> coords;
  std::vector<double> theta;
  for (int64_t k = 0; k < s.dimension(); ++k) {
    coords.push_back(k);
    theta.push_back(gauss(rng));
  }
  std::vector<double> got(static_cast<std::size_t>(model.num_parameters()), 0.0), expect = got;
  s.apply(coords, theta, got);
  for (int64_t k = 0; k < s.dimension(); ++k) {
    const RankOneCoordinate& c = s.coordinates()[static_cast<std::size_t>(k)];
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < c.cols; ++i) {
        const double u = c.row >= 0 ? (r == c.row) : c.u[r];
        const double v = c.col >= 0 ? (i == c.col) : c.v[i];
        expect[static_cast<std::size_t>(c.offset + r * c.cols + i)] +=
            theta[static_cast<std::size_t>(k)] * u * v;
      }
  }
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(expect[i]).margin(1e-12));
}

TEST_CASE("hybrid bases are orthonormal and the map is A V^T + U B", "[subspace]") {
  const Model model = mlp({6, 5, 3});
  HybridSubspace::Options options;
  options.rank = 2;
  options.float32_basis = false;
  const auto s =
      HybridSubspace::from_layout(model.parameter_entries(), model.num_parameters(), options);
  CHECK(s->dimension() == 2 * 11 + 5 + 2 * 8 + 3);
  // The first weight's A-coordinates 0 and 5 use v_0 and v_1 (rows of 5): orthonormal.
  const RankOneCoordinate& a0 = s->coordinates()[0];
  const RankOneCoordinate& a1 = s->coordinates()[5];
  REQUIRE(a0.v != a1.v);
  double dot = 0, n0 = 0, n1 = 0;
  for (int64_t i = 0; i < 6; ++i)
    dot += a0.v[i] * a1.v[i], n0 += a0.v[i] * a0.v[i], n1 += a1.v[i] * a1.v[i];
  CHECK(dot == Approx(0).margin(1e-12));
  CHECK(n0 == Approx(1));
  CHECK(n1 == Approx(1));
  check_map(*s, model);
}

// The build tree's plugins (the factored_subspace target is a dependency of this test).
const PluginRegistry& registry() {
  static PluginRegistry* r = [] {
    auto* loaded = new PluginRegistry();
    loaded->load_directories({PluginRegistry::executable_plugin_dir()});
    return loaded;
  }();
  return *r;
}

TEST_CASE("factored subspace (plugin): rows move along the fixed, orthonormal B", "[subspace]") {
  const Model model = mlp({6, 5, 3});
  const PluginInfo* info = registry().find("factored_subspace");
  REQUIRE(info != nullptr);
  REQUIRE(info->available);
  const auto made = registry().make_subspace(model, {"factored", 2, 0, 3});
  const auto* s = dynamic_cast<const RankOneSubspace*>(made.get());
  REQUIRE(s != nullptr);
  CHECK(s->kind() == "factored");
  CHECK(s->dimension() == 5 * 2 + 5 + 3 * 2 + 3);
  CHECK(s->coordinates()[0].row == 0);
  CHECK(s->coordinates()[1].row == 0);
  CHECK(s->coordinates()[2].row == 1);
  // Coordinates 0 and 1 move row 0 along B's two rows: orthonormal.
  const RankOneCoordinate& b0 = s->coordinates()[0];
  const RankOneCoordinate& b1 = s->coordinates()[1];
  double dot = 0, n0 = 0, n1 = 0;
  for (int64_t i = 0; i < 6; ++i)
    dot += b0.v[i] * b1.v[i], n0 += b0.v[i] * b0.v[i], n1 += b1.v[i] * b1.v[i];
  CHECK(dot == Approx(0).margin(1e-14));
  CHECK(n0 == Approx(1).epsilon(1e-14));
  CHECK(n1 == Approx(1).epsilon(1e-14));
  CHECK(b0.v == s->coordinates()[2].v);  // every row shares B
  check_map(*s, model);
  // The same options give the same bases (what resuming relies on); another seed others.
  const auto again = registry().make_subspace(model, {"factored", 2, 0, 3});
  const auto other = registry().make_subspace(model, {"factored", 2, 0, 4});
  const auto* a = dynamic_cast<const RankOneSubspace*>(again.get());
  const auto* o = dynamic_cast<const RankOneSubspace*>(other.get());
  for (int64_t i = 0; i < 6; ++i) CHECK(a->coordinates()[0].v[i] == b0.v[i]);
  CHECK(o->coordinates()[0].v[0] != b0.v[0]);
}

TEST_CASE("factored subspace (plugin): a dimension bound lowers the rank or is refused",
          "[subspace]") {
  const Model model = mlp({6, 5, 3});
  // rank 2 needs 24; a bound of 20 leaves rank 1: 5 + 5 + 3 + 3 = 16.
  CHECK(registry().make_subspace(model, {"factored", 2, 20, 3})->dimension() == 16);
  try {
    (void)registry().make_subspace(model, {"factored", 2, 10, 3});
    FAIL("a bound below rank 1's dimension was accepted");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("even rank 1 needs 16 coordinates") &&
                             Catch::Contains("plugin factored_subspace"));
  }
}

TEST_CASE("factored subspace (plugin): mixed-dtype models are refused with the reason",
          "[subspace]") {
  const LayerFactory factory = LayerFactory::with_builtins();
  Model model(Shape{{6}});
  model.add(factory.create("linear", {{"out_features", 5}, {"weight_transform", "sign"}},
                           model.output_shape()));
  model.add(factory.create("relu", nlohmann::json::object(), model.output_shape()));
  model.add(factory.create("linear", {{"out_features", 3}}, model.output_shape()));
  try {
    (void)registry().make_subspace(model, {"factored", 2, 0, 3});
    FAIL("a model with binary weights was accepted");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("parameter '0.weight' of layer 0 (linear)") &&
                             Catch::Contains("mixed-dtype models need per-entry subspaces") &&
                             Catch::Contains("--subspace hybrid"));
  }
  // The hybrid subspace has a basis per entry and takes the model.
  CHECK(registry().make_subspace(model, {"hybrid", 2, 0, 3})->dimension() > 0);
}

TEST_CASE("subspace kinds: unknown kinds and a missing plugin are clear errors", "[subspace]") {
  const Model model = mlp({6, 5, 3});
  const PluginRegistry empty;  // no plugins at all
  try {
    (void)empty.make_subspace(model, {"factored", 2, 0, 3});
    FAIL("the factored kind was made without its plugin");
  } catch (const Error& e) {
    CHECK_THAT(e.what(),
               Catch::Contains("unknown subspace kind 'factored' (known: full, hybrid)") &&
                   Catch::Contains("plugin path"));
  }
  const auto kinds = registry().subspace_kinds();
  REQUIRE(kinds.size() == 3);
  CHECK(kinds[0].name == "full");
  CHECK(kinds[1].name == "hybrid");
  CHECK(kinds[1].provider == "core");
  CHECK(std::any_of(kinds.begin(), kinds.end(), [](const NamedComponent& c) {
    return c.name == "factored" && c.provider == "factored_subspace";
  }));
}

}  // namespace
}  // namespace polyprobe
