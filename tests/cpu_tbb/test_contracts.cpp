// Layer contracts are probed: a false declaration costs speed, never a wrong loss.
#include "cpu_tbb/cpu_tbb_fixture.hpp"

#include <polyprobe/plugin/kernels/activations.hpp>

namespace polyprobe::test {
namespace {

// A test-only layer whose forward is `Fn` and whose contract is `contract` (true or not).
template <class Fn>
class ScriptedLayer final : public LayerBase<ScriptedLayer<Fn>> {
 public:
  ScriptedLayer(std::string kind, Shape in, Shape out, LayerContract contract,
                std::vector<ParamSpec> params, Fn fn)
      : kind_(std::move(kind)),
        in_(std::move(in)),
        out_(std::move(out)),
        contract_(contract),
        params_(std::move(params)),
        fn_(fn) {}
  std::string kind() const override { return kind_; }
  LayerContract contract() const override { return contract_; }
  std::vector<ParamSpec> parameters() const override { return params_; }
  const Shape& input_shape() const override { return in_; }
  const Shape& output_shape() const override { return out_; }
  void initialize(std::span<double> params, std::mt19937_64& rng) const override {
    std::uniform_real_distribution<double> u(-0.5, 0.5);
    for (double& p : params) p = u(rng);
  }
  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S> params, MatrixRef<S> y) const {
    fn_(x, params, y);
  }

 private:
  std::string kind_;
  Shape in_, out_;
  LayerContract contract_;
  std::vector<ParamSpec> params_;
  Fn fn_;
};

template <class Fn>
std::shared_ptr<const Layer> scripted(std::string kind, int64_t in, int64_t out,
                                      LayerContract contract, std::vector<ParamSpec> params,
                                      Fn fn) {
  return std::make_shared<const ScriptedLayer<Fn>>(std::move(kind), Shape{{in}}, Shape{{out}},
                                                   contract, std::move(params), fn);
}

double relu_fn(const void*, double x) { return x > 0 ? x : 0; }

// Claims elementwise ReLU, but mixes each feature with its neighbour.
std::shared_ptr<const Layer> lying_elementwise(int64_t width) {
  LayerContract c;
  c.elementwise = true;
  c.elementwise_fn = {&relu_fn, nullptr};
  return scripted("lying_relu", width, width, c, {}, [](const auto& x, const auto&, auto& y) {
    using S = typename std::decay_t<decltype(x)>::Scalar;
    for (Eigen::Index r = 0; r < x.rows(); ++r)
      for (Eigen::Index j = 0; j < x.cols(); ++j)
        y(r, j) = kernels::relu(x(r, j)) + S(0.5) * x(r, (j + 1) % x.cols());
  });
}

// Claims y = x W^T + b, but applies tanh afterwards.
std::shared_ptr<const Layer> lying_affine(int64_t in, int64_t out) {
  LayerContract c;
  c.affine = true;
  c.affine_has_bias = true;
  return scripted("lying_linear", in, out, c, {{"weight", {out, in}}, {"bias", {out}}},
                  [in, out](const auto& x, const auto& p, auto& y) {
                    using S = typename std::decay_t<decltype(x)>::Scalar;
                    const Eigen::Map<const Matrix<S>> w(p.data(), out, in);
                    const Eigen::Map<const Eigen::Matrix<S, 1, Eigen::Dynamic>> b(
                        p.data() + out * in, out);
                    y = ((x * w.transpose()).rowwise() + b).array().tanh().matrix();
                  });
}

// Declares nothing and squares its input: runs through the host forward.
std::shared_ptr<const Layer> square(int64_t width) {
  return scripted("square", width, width, LayerContract{}, {},
                  [](const auto& x, const auto&, auto& y) { y = x.array().square().matrix(); });
}

// A parameter-free layer that says its output may depend on more than its input.
std::shared_ptr<const Layer> not_prefix_reusable(int64_t width) {
  LayerContract c;
  c.prefix_reusable = false;
  return scripted("stateful", width, width, c, {},
                  [](const auto& x, const auto&, auto& y) { y = x; });
}

void check_against_reference(const Model& model, int32_t d, const std::string& expect_path) {
  const auto loss = make_loss("cross_entropy", 1e-3);
  const Batch batch = make_batch(model, 7);
  const Candidates cands = make_candidates(model.num_parameters(), d, 3, 0.3);
  const Run ref = run_evaluator(model, *loss, batch, cands, request("reference", DType::f64));
  for (const DType dtype : {DType::f64, DType::f32}) {
    const Run got = run_evaluator(model, *loss, batch, cands, request("cpu_tbb", dtype));
    INFO(got.explain.dump(1));
    CHECK(max_rel_diff(got.losses, ref.losses) < (dtype == DType::f64 ? 1e-12 : 1e-5));
    CHECK(candidates_on(got.explain, expect_path) > 0);
  }
}

TEST_CASE("cpu_tbb: a false elementwise declaration is caught by probing", "[cpu_tbb][contracts]") {
  const Model model = make_model(
      4, {{"linear", {{"out_features", 5}}}, {"*", {}}, {"linear", {{"out_features", 3}}}}, 1,
      {lying_elementwise(5)});
  check_against_reference(model, 2, "sparse");  // layer 2's particles still take deltas
  const auto loss = make_loss("cross_entropy");
  const Run run = run_evaluator(model, *loss, make_batch(model, 3),
                                make_candidates(model.num_parameters(), 2, 1, 0.1),
                                request("cpu_tbb", DType::f64));
  const auto& layer = run.explain["plugin"]["layers"][1];
  CHECK(layer["runs_as"] == "host");
  CHECK_THAT(layer["contract_not_trusted"].get<std::string>(), Catch::Contains("elementwise"));
  CHECK(run.explain["plugin"]["layers"][0]["candidates_starting_here"].contains("sparse"));
}

TEST_CASE("cpu_tbb: a false affine declaration is caught by probing", "[cpu_tbb][contracts]") {
  const Model model = make_model(4, {{"*", {}}, {"relu", {}}, {"linear", {{"out_features", 3}}}}, 1,
                                 {lying_affine(4, 5)});
  check_against_reference(model, 2, "dense");
  const auto loss = make_loss("cross_entropy");
  const Run run = run_evaluator(model, *loss, make_batch(model, 3),
                                make_candidates(model.num_parameters(), 2, 1, 0.1),
                                request("cpu_tbb", DType::f64));
  CHECK_THAT(run.explain["plugin"]["layers"][0]["contract_not_trusted"].get<std::string>(),
             Catch::Contains("affine"));
}

TEST_CASE("cpu_tbb: host layers after a change turn the delta into whole activations",
          "[cpu_tbb][contracts]") {
  const Model model = make_model(4,
                                 {{"linear", {{"out_features", 6}}},
                                  {"*", {}},
                                  {"layer_norm", {}},
                                  {"relu", {}},
                                  {"linear", {{"out_features", 3}}}},
                                 1, {square(6)});
  check_against_reference(model, 2, "sparse");
  check_against_reference(model, 3, "dense");  // particles across the host layers
}

TEST_CASE("cpu_tbb: a layer that is not prefix-reusable forces the whole forward",
          "[cpu_tbb][contracts]") {
  const Model model = make_model(4,
                                 {{"linear", {{"out_features", 5}}},
                                  {"*", {}},
                                  {"relu", {}},
                                  {"linear", {{"out_features", 3}}}},
                                 1, {not_prefix_reusable(5)});
  check_against_reference(model, 2, "fallback");
}

}  // namespace
}  // namespace polyprobe::test
