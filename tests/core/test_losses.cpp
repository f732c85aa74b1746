#include <polyprobe/error.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>

using namespace polyprobe;

namespace {
std::vector<double> per_sample(const Loss& loss, const Matrix<double>& out, const Targets& t) {
  std::vector<double> v(static_cast<std::size_t>(out.rows()));
  loss.per_sample(out, t, 0, v);
  return v;
}
}  // namespace

TEST_CASE("losses compute their PyTorch definitions") {
  Matrix<double> out(2, 3);
  out << 1.0, 2.0, 0.5, -1.0, 0.0, 3.0;
  Targets labels;
  labels.labels = {1, 0};
  const auto ce = per_sample(*make_loss("cross_entropy"), out, labels);
  CHECK(ce[0] == Approx(std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.5)) - 2.0));
  CHECK(ce[1] == Approx(std::log(std::exp(-1.0) + std::exp(0.0) + std::exp(3.0)) + 1.0));
  const auto hinge = per_sample(*make_loss("hinge"), out, labels);
  CHECK(hinge[0] == Approx((std::max(0.0, 1 - 2 + 1.0) + std::max(0.0, 1 - 2 + 0.5)) / 3));
  CHECK(hinge[1] == Approx((std::max(0.0, 1 + 1 + 0.0) + std::max(0.0, 1 + 1 + 3.0)) / 3));
  const auto zo = per_sample(*make_loss("zero_one"), out, labels);
  CHECK(zo[0] == 0.0);
  CHECK(zo[1] == 1.0);
  Targets values;
  values.values = Matrix<double>::Zero(2, 3);
  values.values(0, 0) = 1.0;
  const auto mse = per_sample(*make_loss("mse"), out, values);
  CHECK(mse[0] == Approx((0.0 + 4.0 + 0.25) / 3));
}

TEST_CASE("cross-entropy stays finite for huge logits") {
  Matrix<double> out(1, 2);
  out << 1000.0, -1000.0;
  Targets t;
  t.labels = {1};
  CHECK(per_sample(*make_loss("cross_entropy"), out, t)[0] == Approx(2000.0));
}

TEST_CASE("zero-one takes the first maximal output, as torch.argmax") {
  Matrix<double> out(1, 3);
  out << 2.0, 2.0, 1.0;
  Targets t;
  t.labels = {1};
  CHECK(per_sample(*make_loss("zero_one"), out, t)[0] == 1.0);
}

TEST_CASE("the objective adds l2 * |theta|^2 to the mean loss") {
  const LayerFactory f = LayerFactory::with_builtins();
  Model model(Shape{{2}});
  model.add(f.create("linear", {{"out_features", 2}}, model.output_shape()));
  model.initialize(3);
  Batch batch;
  batch.inputs = Matrix<double>::Random(4, 2);
  batch.targets.labels = {0, 1, 1, 0};
  const auto plain = make_loss("cross_entropy");
  const auto reg = make_loss("cross_entropy", 0.01);
  double sq = 0;
  for (double p : model.parameters()) sq += p * p;
  CHECK(objective(model, *reg, batch, model.parameters()) ==
        Approx(objective(model, *plain, batch, model.parameters()) + 0.01 * sq).epsilon(1e-14));
}

TEST_CASE("bad loss names, weights and labels are clear errors") {
  CHECK_THROWS_WITH(make_loss("crossentropy"), Catch::Contains("unknown loss 'crossentropy'"));
  CHECK_THROWS_WITH(make_loss("mse", -1.0), Catch::Contains(">= 0"));
  CHECK_THROWS_WITH(make_loss("mse", std::nan("")), Catch::Contains(">= 0"));
  Targets t;
  t.labels = {0, 5};
  CHECK_THROWS_WITH(make_loss("cross_entropy")->check_targets(t, 3),
                    Catch::Contains("label 5 of sample 1 is out of range"));
  CHECK_THROWS_WITH(make_loss("mse")->check_targets(t, 3),
                    Catch::Contains("needs regression targets (3 values per sample)") &&
                        Catch::Contains("class labels"));
  Targets values;
  values.values = Matrix<double>::Zero(2, 2);
  CHECK_THROWS_WITH(make_loss("mse")->check_targets(values, 3),
                    Catch::Contains("needs 3 target values per sample, got 2"));
}
