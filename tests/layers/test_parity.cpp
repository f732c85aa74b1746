// Parity with PyTorch: every layer kind, a few whole models and every loss, against the
// fixtures of tools/make_fixtures.py, to 1e-5 relative (to max(|expected|, 1)) in float32.
#include "layers/fixtures.hpp"

#include <polyprobe/loss.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>

namespace polyprobe::testing {

std::vector<std::string> fixture_cases() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(fixture_dir()))
    if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

Fixture load_fixture(const std::string& name) {
  const LayerFactory factory = LayerFactory::with_builtins();
  Fixture fixture{read_model_file(fixture_dir() / (name + ".json"), factory), {}, {}, 0.0, false};
  TensorFile tensors = read_safetensors(fixture_dir() / (name + ".safetensors"));
  TensorFile weights;
  const auto rows = [](const NamedTensor& t) { return t.shape.at(0); };
  for (NamedTensor& t : tensors.tensors) {
    const Eigen::Index n = static_cast<Eigen::Index>(t.values.size());
    if (t.name == "input" || t.name == "output" || t.name == "targets") {
      const Eigen::Map<const Matrix<double>> m(t.values.data(), rows(t), n / rows(t));
      if (t.name == "input")
        fixture.batch.inputs = m;
      else if (t.name == "output")
        fixture.expected = m;
      else
        fixture.batch.targets.values = m;
    } else if (t.name == "labels") {
      for (double v : t.values) fixture.batch.targets.labels.push_back(static_cast<int64_t>(v));
    } else if (t.name == "objective") {
      fixture.objective = t.values.at(0);
      fixture.has_objective = true;
    } else {
      weights.tensors.push_back(std::move(t));
    }
  }
  assign_model_tensors(fixture.file.model, weights, name);
  return fixture;
}

namespace {

template <class S>
double worst_relative_error(const Matrix<S>& got, const Matrix<double>& expected) {
  REQUIRE(got.rows() == expected.rows());
  REQUIRE(got.cols() == expected.cols());
  double worst = 0.0;
  for (Eigen::Index i = 0; i < got.size(); ++i) {
    const double e = expected.data()[i];
    worst = std::max(worst,
                     std::abs(static_cast<double>(got.data()[i]) - e) / std::max(std::abs(e), 1.0));
  }
  return worst;
}

}  // namespace

TEST_CASE("every fixture agrees with PyTorch in float32 and float64", "[layers][parity]") {
  const std::vector<std::string> names = fixture_cases();
  REQUIRE(names.size() >= 30);
  for (const std::string& name : names) {
    DYNAMIC_SECTION(name) {
      const Fixture f = load_fixture(name);
      const Model& model = f.file.model;
      const Matrix<float> x32 = f.batch.inputs.cast<float>();
      CHECK(worst_relative_error<float>(model.forward<float>(x32), f.expected) < 1e-5);
      CHECK(worst_relative_error<double>(model.forward<double>(f.batch.inputs), f.expected) < 1e-6);
    }
  }
}

TEST_CASE("every layer kind has a fixture", "[layers][parity]") {
  const std::vector<std::string> names = fixture_cases();
  const LayerFactory factory = LayerFactory::with_builtins();
  for (const auto& [kind, entry] : factory.kinds()) {
    bool covered = false;
    for (const std::string& name : names) {
      const std::string text = [&] {
        std::ifstream in(fixture_dir() / (name + ".json"));
        return std::string(std::istreambuf_iterator<char>(in), {});
      }();
      covered = covered || text.find("\"" + kind + "\"") != std::string::npos;
    }
    INFO("layer kind " << kind);
    CHECK(covered);
  }
}

TEST_CASE("losses with l2 agree with PyTorch", "[loss][parity]") {
  for (const std::string name : {"loss_cross_entropy", "loss_mse", "loss_hinge", "loss_zero_one"}) {
    DYNAMIC_SECTION(name) {
      const Fixture f = load_fixture(name);
      REQUIRE(f.has_objective);
      const auto loss = make_loss(f.file.loss, f.file.l2);
      CHECK(f.file.l2 == 0.01);
      const auto params = f.file.model.parameters();
      CHECK(objective(f.file.model, *loss, f.batch, params, DType::f32) ==
            Approx(f.objective).epsilon(1e-5));
      CHECK(objective(f.file.model, *loss, f.batch, params, DType::f64) ==
            Approx(f.objective).epsilon(1e-6));
    }
  }
}

}  // namespace polyprobe::testing
