// The option table: every option parses what it prints, malformed values and options given
// where they have no effect are one-line errors naming the option and the rule, the subspace
// kinds build, and docs/training.md lists exactly the table.
#include <catch2/catch.hpp>

#include "optimizer_fixtures.hpp"

#include <polyprobe/ask_tell.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/minimize.hpp>
#include <polyprobe/optimizer_options.hpp>
#include <polyprobe/subspaces.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

using namespace polyprobe;

namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

OptimizerSettings with(OptimizerSettings s, const Pairs& pairs) {
  for (const auto& [key, value] : pairs) set_option(s, key, value);
  return s;
}

// The message validate_settings() throws, or "" when it accepts.
std::string rejection(const OptimizerSettings& s, OptionScope scope) {
  try {
    validate_settings(s, scope);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string set_error(const std::string& key, const std::string& value) {
  OptimizerSettings s = training_defaults();
  try {
    set_option(s, key, value);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The optimizer-option tables of docs/training.md as they must read: one table per group.
std::string expected_docs() {
  std::ostringstream out;
  const OptimizerSettings train = training_defaults();
  std::string group;
  for (const OptimizerOption& o : optimizer_options()) {
    if (o.group != group) {
      group = o.group;
      out << "\n**" << group << "**\n\n| option | default | meaning |\n| --- | --- | --- |\n";
    }
    out << "| `--" << o.name << "`";
    if (!o.aliases.empty()) out << " (also";
    for (std::size_t i = 0; i < o.aliases.size(); ++i)
      out << (i == 0 ? " `" : ", `") << o.aliases[i] << "`";
    if (!o.aliases.empty()) out << ")";
    out << " | `" << o.get(train) << "` | " << o.help;
    if (!o.requirement.empty()) out << "; only with " << o.requirement;
    if (o.scope == OptionScope::minimize) out << " (bench dfo and minimize() only)";
    if (o.scope == OptionScope::training) out << " (train only)";
    out << " |\n";
  }
  return out.str();
}

}  // namespace

TEST_CASE("every option reads back what it prints, and records that it was given",
          "[optimizer][options]") {
  const OptimizerSettings defaults = training_defaults();
  REQUIRE(rejection(defaults, OptionScope::training).empty());
  for (const OptimizerOption& o : optimizer_options()) {
    INFO(o.name);
    OptimizerSettings s = defaults;
    const std::string text = o.get(s);
    set_option(s, o.name, text);
    CHECK(o.get(s) == text);
    CHECK(s.given.count(o.name) == 1);
    CHECK(find_option(o.name) == &o);
    for (const std::string& alias : o.aliases) CHECK(find_option(alias) == &o);
    CHECK(!o.help.empty());
    // A choice's help names every value it accepts (--help and the docs show only the help).
    for (const std::string& c : o.choices) CHECK_THAT(o.help, Catch::Contains(c));
    CHECK((o.applies == nullptr) == o.requirement.empty());
  }
}

TEST_CASE("options set the fields they name, under their names, aliases and underscores",
          "[optimizer][options]") {
  const OptimizerSettings s = with(training_defaults(), {{"K", "3"},
                                                         {"step_radius", "4.5"},
                                                         {"polytope", "orthoplex"},
                                                         {"blocks", "per_layer"},
                                                         {"momentum", "on"},
                                                         {"momentum-final", "0.9"},
                                                         {"radius", "fixed"},
                                                         {"solver", "top_k"},
                                                         {"top-k", "3"},
                                                         {"subspace", "hybrid"},
                                                         {"rank", "4"},
                                                         {"max-subspace-dim", "500"}});
  CHECK(s.optimizer.num_probe == 3);
  CHECK(s.optimizer.step_radius == 4.5);
  CHECK(s.optimizer.polytope == PolytopeKind::orthoplex);
  CHECK(s.optimizer.blocks == BlockStrategy::per_layer);
  CHECK(s.optimizer.momentum);
  CHECK(s.optimizer.momentum_final == 0.9);
  CHECK(s.optimizer.radius.kind == RadiusModelKind::fixed);
  CHECK(s.optimizer.solver == TransportSolver::top_k);
  CHECK(s.optimizer.top_k == 3);
  CHECK(s.subspace.kind == "hybrid");
  CHECK(s.subspace.rank == 4);
  CHECK(s.subspace.max_subspace_dim == 500);
  CHECK(rejection(s, OptionScope::training).empty());
}

TEST_CASE("a malformed value names the option and what it expects", "[optimizer][options]") {
  CHECK_THAT(set_error("num-probe", "x"),
             Catch::Equals("--num-probe: expected an integer, got 'x'"));
  CHECK_THAT(set_error("num-probe", "1.5"), Catch::Contains("expected an integer"));
  CHECK_THAT(set_error("particle-dim", "99999999999"), Catch::Contains("an integer in ["));
  CHECK_THAT(set_error("step-radius", "fast"),
             Catch::Equals("--step-radius: expected a finite number, got 'fast'"));
  CHECK_THAT(set_error("step-radius", "nan"), Catch::Contains("a finite number"));
  CHECK_THAT(set_error("step-radius", "1e999"), Catch::Contains("a finite number"));
  CHECK_THAT(set_error("momentum", "maybe"), Catch::Contains("--momentum: expected on or off"));
  CHECK_THAT(set_error("polytope", "sphere"),
             Catch::Contains("--polytope: unknown polytope 'sphere'"));
  CHECK_THAT(set_error("subspace", "lowrank"),
             Catch::Contains("--subspace: unknown subspace kind 'lowrank' (kinds: full, hybrid)"));
  CHECK_THAT(set_error("radius-model", "newton"), Catch::Contains("--radius-model"));
  CHECK_THAT(set_error("solver", "exact"), Catch::Contains("--solver"));
  CHECK_THAT(set_error("blocks", "layers"), Catch::Contains("--blocks"));
  CHECK_THAT(set_error("no-such-option", "1"),
             Catch::Contains("unknown optimizer option 'no-such-option'"));
  CHECK(set_error("step-radius", "0.25").empty());
}

TEST_CASE("an option given where it has no effect is an error naming its rule",
          "[optimizer][options]") {
  struct Case {
    std::string key, value;
    std::string requirement;  // the rule the message must name
    Pairs enable;             // settings under which the option applies
  };
  const std::vector<Case> cases = {
      {"subspace-rank", "4", "--subspace hybrid or factored", {{"subspace", "hybrid"}}},
      {"max-subspace-dim", "100", "--subspace hybrid or factored", {{"subspace", "hybrid"}}},
      {"subspace-seed", "5", "--subspace hybrid or factored", {{"subspace", "hybrid"}}},
      {"subspace-particle-dim", "4", "--subspace hybrid or factored", {{"subspace", "hybrid"}}},
      {"subspace-rotation-interval",
       "3",
       "--subspace hybrid or factored",
       {{"subspace", "hybrid"}}},
      {"epsilon-final",
       "0.01",
       "--schedule linear, cosine or progressive",
       {{"schedule", "linear"}}},
      {"schedule-decay-steps", "50", "--schedule power", {{"schedule", "power"}}},
      {"schedule-power", "1", "--schedule power", {{"schedule", "power"}}},
      {"schedule-decay-rate",
       "0.9",
       "--schedule progressive",
       {{"schedule", "progressive"}, {"solver", "sinkhorn"}}},
      {"stagnation-patience", "3", "--radius-model adaptive", {{"radius-model", "adaptive"}}},
      {"radius-max", "2", "--radius-model adaptive", {{"radius-model", "adaptive"}}},
      {"quadratic-max-scale", "3", "--radius-model quadratic or trust_region", {}},
      {"sinkhorn-tolerance", "1e-5", "--solver sinkhorn", {}},
      {"top-k", "3", "--solver top_k", {{"solver", "top_k"}}},
      {"block-group-size", "3", "--blocks grouped", {{"blocks", "grouped"}}},
      {"momentum-init", "0.3", "--momentum", {{"momentum", "on"}}},
      {"velocity-lr", "0.5", "--momentum", {{"momentum", "on"}}},
      {"adaptive-probes-threshold",
       "1e-4",
       "--adaptive-probes",
       {{"radius-model", "fixed"}, {"adaptive-probes", "on"}}},
      {"amortize-ema", "0.5", "--amortize-steps 2 or more", {{"amortize-steps", "2"}}},
      {"screen-fidelity",
       "0.2",
       "--multifidelity-screen",
       {{"radius-model", "fixed"}, {"multifidelity-screen", "on"}}},
      {"screen-keep-ratio",
       "0.4",
       "--multifidelity-screen",
       {{"radius-model", "fixed"}, {"multifidelity-screen", "on"}}},
  };
  for (const Case& c : cases) {
    INFO(c.key);
    // Break the rule where the training defaults meet it.
    Pairs off;
    if (c.key == "epsilon-final") off = {{"schedule", "constant"}};
    if (c.key == "quadratic-max-scale") off = {{"radius-model", "fixed"}};
    if (c.key == "sinkhorn-tolerance") off = {{"solver", "softmax"}};
    const OptimizerSettings unmet = with(with(training_defaults(), off), {{c.key, c.value}});
    CHECK_THAT(
        rejection(unmet, OptionScope::training),
        Catch::StartsWith("--" + c.key + " has no effect here: it applies with " + c.requirement));
    const OptimizerSettings met = with(training_defaults(), c.enable);
    CHECK(rejection(with(met, {{c.key, c.value}}), OptionScope::training).empty());
  }
  // The full-space particle size in a subspace, and the Sinkhorn cap where auto means softmax.
  CHECK_THAT(rejection(with(training_defaults(), {{"subspace", "hybrid"}, {"particle-dim", "4"}}),
                       OptionScope::training),
             Catch::Contains("--particle-dim has no effect here") &&
                 Catch::Contains("--subspace-particle-dim"));
  CHECK_THAT(rejection(with(training_defaults(),
                            {{"subspace", "hybrid"}, {"sinkhorn-max-iterations", "10"}}),
                       OptionScope::training),
             Catch::Contains("--sinkhorn-max-iterations has no effect here"));
}

TEST_CASE("the combination rules of training and of the optimizer are one-line errors",
          "[optimizer][options]") {
  struct Case {
    Pairs pairs;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {{{"radius-model", "trust_region"}}, "--radius-model trust_region needs one fixed objective"},
      {{{"trust-min", "0.1"}}, "--trust-min applies to minimize() and bench dfo only"},
      {{{"adaptive-probes", "on"}}, "adaptive_probes cannot run with the quadratic"},
      {{{"multifidelity-screen", "on"}}, "multifidelity_screen cannot run with the quadratic"},
      {{{"radius-model", "fixed"}, {"multifidelity-screen", "on"}, {"screen-keep-ratio", "0.8"}},
       "screen_fidelity / num_probe + screen_keep_ratio < 1"},
      {{{"radius-model", "fixed"}, {"metric", "bfgs"}}, "metric = bfgs"},
      {{{"polytope", "cube"}, {"particle-dim", "17"}}, "the cube has 2^d vertices"},
      {{{"solver", "top_k"}, {"top-k", "4"}}, "solver top_k needs 1 <= top_k <= V = 3"},
      {{{"schedule", "progressive"}, {"solver", "softmax"}}, "use solver = sinkhorn"},
      {{{"num-probe", "0"}}, "num_probe (K) must be at least 1"},
      {{{"amortize-steps", "0"}}, "amortize_steps must be at least 1"},
      {{{"momentum", "on"}, {"momentum-init", "1"}}, "momentum_init and momentum_final"},
      {{{"step-radius", "-1"}}, "step_radius must be positive"},
      {{{"subspace", "hybrid"}, {"subspace-rank", "0"}}, "--subspace-rank must be at least 1"},
      {{{"subspace", "hybrid"}, {"max-subspace-dim", "-5"}}, "--max-subspace-dim must be >= 0"},
      {{{"subspace", "hybrid"}, {"subspace-rotation-interval", "-2"}},
       "subspace_rotation_interval must be 0 (never) or a positive step count"},
  };
  for (const Case& c : cases) {
    INFO(c.reason);
    const std::string message =
        rejection(with(training_defaults(), c.pairs), OptionScope::training);
    CHECK_THAT(message, Catch::Contains(c.reason));
    CHECK(message.find('\n') == std::string::npos);
  }
  // Scope: a training-only option in minimize().
  CHECK_THAT(rejection(with(OptimizerSettings{}, {{"subspace", "hybrid"}}), OptionScope::minimize),
             Catch::Contains("--subspace applies to polyprobe train only"));
  OptimizerSettings trust;
  trust.optimizer.radius.kind = RadiusModelKind::trust_region;
  CHECK(
      rejection(with(trust, {{"trust-min", "1e-9"}, {"trust-reject", "on"}}), OptionScope::minimize)
          .empty());
}

TEST_CASE("subspace kinds are looked up by name and build their subspace",
          "[optimizer][options][subspace]") {
  const Model model = testing::small_mlp(1, 8, 16, 4);
  CHECK(subspace_kind_names() == "full, hybrid");  // factored: the plugin factored_subspace
  SubspaceSettings s;
  CHECK(make_subspace(model, s) == nullptr);
  s.kind = "hybrid";
  s.rank = 2;
  const auto hybrid = make_subspace(model, s);
  REQUIRE(hybrid != nullptr);
  CHECK(hybrid->kind() == "hybrid");
  // (16 + 8) 2 + 16 + (4 + 16) 2 + 4 coordinates: A and B per weight, biases raw.
  CHECK(hybrid->dimension() == 48 + 16 + 40 + 4);
  s.max_subspace_dim = 50;
  CHECK(make_subspace(model, s)->dimension() <= 50);
  s.kind = "spectral";
  CHECK_THROWS_WITH(make_subspace(model, s),
                    "unknown subspace kind 'spectral' (kinds: full, hybrid)");
}

TEST_CASE("a rotation interval needs a subspace that can rotate",
          "[optimizer][options][subspace]") {
  // In the option table the rule is "--subspace hybrid or factored" (above); the library
  // checks it again where no table was involved.
  Model model = testing::small_mlp(1, 8, 16, 4);
  OptimizerConfig config;
  config.subspace_rotation_interval = 3;
  CHECK_THROWS_WITH(PolytopeOptimizer(model, config),
                    "PolytopeOptimizer: subspace_rotation_interval needs a subspace that can "
                    "rotate (--subspace hybrid or factored), not the full space");
  SubspaceSettings s;
  s.kind = "hybrid";
  s.rank = 2;
  const auto hybrid = make_subspace(model, s);
  CHECK_NOTHROW(PolytopeOptimizer(model, config, hybrid.get()));
  // The searches without a model have no subspace to rotate.
  const std::vector<double> x0 = {1.0, 2.0};
  const Objective sphere = [](std::span<const double> x) { return x[0] * x[0] + x[1] * x[1]; };
  CHECK_THROWS_WITH(minimize(sphere, x0, 10, config),
                    Catch::Contains("minimize: subspace_rotation_interval"));
  CHECK_THROWS_WITH(AskTellOptimizer(Matrix<double>::Zero(3, 2), config),
                    Catch::Contains("AskTellOptimizer: subspace_rotation_interval"));
}

TEST_CASE("docs/training.md lists exactly the option table", "[optimizer][options][docs]") {
  std::ifstream file(std::string(POLYPROBE_SOURCE_DIR) + "/docs/training.md");
  REQUIRE(file);
  std::stringstream text;
  text << file.rdbuf();
  const std::string docs = text.str();
  const std::string begin = "<!-- optimizer options: begin (tests/optimizer/test_options.cpp) -->";
  const std::string end = "<!-- optimizer options: end -->";
  const auto from = docs.find(begin), to = docs.find(end);
  REQUIRE(from != std::string::npos);
  REQUIRE(to != std::string::npos);
  const std::string listed = docs.substr(from + begin.size(), to - from - begin.size());
  // On a mismatch the expected text goes to a file: paste it between the markers.
  const bool same = listed == expected_docs() + "\n";
  if (!same) std::ofstream("expected-optimizer-options.md") << expected_docs() << "\n";
  INFO(
      "docs/training.md differs from the table: the test wrote the expected text to "
      "expected-optimizer-options.md in its working directory");
  CHECK(same);
}
