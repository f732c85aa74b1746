// The site-local path (conv1d, conv2d, self_attention, moe) against the core's float64 reference:
// every candidate's loss, the path actually taken, its declines, threads and chunks.
#include "cpu_tbb/cpu_tbb_fixture.hpp"

namespace polyprobe::test {
namespace {

using Layers = std::vector<std::pair<std::string, nlohmann::json>>;

double tolerance(DType dtype) { return dtype == DType::f64 ? 1e-12 : 1e-5; }

Model spatial_model(const Shape& input, const Layers& layers, uint64_t seed = 5,
                    const std::vector<std::shared_ptr<const Layer>>& extra = {}) {
  return make_model(input, layers, seed, extra);
}

// Candidates whose particle lies wholly in a layer of one of `kinds` (the site-local ones).
int64_t candidates_in(const Model& model, const Candidates& cands,
                      const std::vector<std::string>& kinds) {
  int64_t total = 0;
  for (const int64_t p : cands.particle) {
    int64_t layer = -1;
    bool one = true;
    for (const int64_t coord : cands.particles.particle(p)) {
      if (coord < 0) continue;
      int64_t l = 0;
      while (l + 1 < static_cast<int64_t>(model.num_layers()) &&
             model.layer_offset(static_cast<std::size_t>(l + 1)) <= coord)
        ++l;
      if (layer >= 0 && l != layer) one = false;
      layer = l;
    }
    if (!one || layer < 0) continue;
    const std::string kind = model.layer(static_cast<std::size_t>(layer)).kind();
    if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end()) ++total;
  }
  return total;
}

int64_t declined_for(const nlohmann::json& explain, const std::string& prefix) {
  int64_t total = 0;
  for (const auto& layer : explain.at("plugin").at("layers"))
    for (const auto& d : layer.at("declined"))
      if (d.at("why").get<std::string>().rfind(prefix, 0) == 0)
        total += d.at("candidates").get<int64_t>();
  return total;
}

// Auto and forced site-local, float64 and float32, d = 2 and 3: every loss equals the
// reference's, and every candidate whose particle lies in the site-local layer took the path.
void check_site_local(const Model& model, const std::vector<std::string>& kinds,
                      double radius = 0.3) {
  const auto loss = make_loss("cross_entropy", 1e-3);
  const Batch batch = make_batch(model, 6);
  for (const int32_t d : {2, 3}) {
    const Candidates cands = make_candidates(model.num_parameters(), d, 3, radius);
    const int64_t expect = candidates_in(model, cands, kinds);
    REQUIRE(expect > 0);
    const Run ref = run_evaluator(model, *loss, batch, cands, request("reference", DType::f64));
    for (const std::string path : {"", "site-local"})
      for (const DType dtype : {DType::f64, DType::f32}) {
        INFO("d = " << d << ", path " << (path.empty() ? "auto" : path) << ", "
                    << to_string(dtype));
        const Run got = run_evaluator(model, *loss, batch, cands, request("cpu_tbb", dtype, path));
        CHECK(max_rel_diff(got.losses, ref.losses) < tolerance(dtype));
        CHECK(candidates_on(got.explain, "site-local") == expect);
        CHECK(declined_for(got.explain, "site-local probe failed") == 0);
      }
    // The dense path on the same candidates, for comparison, agrees too.
    const Run dense =
        run_evaluator(model, *loss, batch, cands, request("cpu_tbb", DType::f64, "dense"));
    CHECK(max_rel_diff(dense.losses, ref.losses) < 1e-12);
    CHECK(candidates_on(dense.explain, "site-local") == 0);
    CHECK(declined_for(dense.explain, "site-local not used") == expect);
  }
}

TEST_CASE("cpu_tbb: site-local, conv2d, stride 2 and padding, relu, max-pool, linear",
          "[cpu_tbb]") {
  const Model model = spatial_model(
      Shape{{2, 7, 6}},
      {{"conv2d", {{"out_channels", 4}, {"kernel_size", 3}, {"stride", 2}, {"padding", 1}}},
       {"relu", {}},
       {"max_pool2d", {{"kernel_size", 2}}},
       {"flatten", {}},
       {"linear", {{"out_features", 3}}}});
  check_site_local(model, {"conv2d"});
}

// The explain entry of the model's first layer: what the site-local path said of it.
std::string site_local_note(const Model& model) {
  const auto loss = make_loss("cross_entropy");
  const Batch batch = make_batch(model, 3);
  const Candidates cands = make_candidates(model.num_parameters(), 2, 1, 0.1);
  const Run got = run_evaluator(model, *loss, batch, cands, request("cpu_tbb", DType::f64));
  return got.explain["plugin"]["layers"][0]["site_local"].get<std::string>();
}

TEST_CASE("cpu_tbb: site-local, max-pool pairs over an even-width map with an odd height",
          "[cpu_tbb]") {
  // 7 x 20 maps: the channel tail pools row pairs (a packet and one overlapping it, in float32
  // and float64), then column pairs of the flat map, and drops the seventh row, as the layer
  // does.
  const Model model = spatial_model(
      Shape{{2, 7, 20}}, {{"conv2d", {{"out_channels", 3}, {"kernel_size", 3}, {"padding", 1}}},
                          {"relu", {}},
                          {"max_pool2d", {{"kernel_size", 2}}},
                          {"flatten", {}},
                          {"linear", {{"out_features", 4}}}});
  check_site_local(model, {"conv2d"});
  CHECK_THAT(site_local_note(model),
             Catch::Contains("channel-local tail through relu, max_pool2d, flatten"));
}

TEST_CASE("cpu_tbb: site-local, a conv's channel-local tail into the next affine layer",
          "[cpu_tbb]") {
  // Through tanh, padded average pooling and sign, then a suffix after the affine layer.
  const Model avg = spatial_model(
      Shape{{2, 7, 6}}, {{"conv2d", {{"out_channels", 4}, {"kernel_size", 3}, {"padding", 1}}},
                         {"tanh", {}},
                         {"avg_pool2d", {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}},
                         {"gelu", {}},
                         {"flatten", {}},
                         {"linear", {{"out_features", 5}}},
                         {"relu", {}},
                         {"linear", {{"out_features", 3}}}});
  check_site_local(avg, {"conv2d"});
  CHECK(site_local_note(avg) ==
        "yes (probed); channel-local tail through tanh, avg_pool2d, gelu, flatten, into layer 5 "
        "(linear)");
  // 1-D, max pooling with an odd length, straight into the last layer.
  const Model one_d = spatial_model(
      Shape{{3, 10}}, {{"conv1d", {{"out_channels", 3}, {"kernel_size", 2}, {"groups", 3}}},
                       {"relu", {}},
                       {"max_pool1d", {{"kernel_size", 2}, {"stride", 2}}},
                       {"flatten", {}},
                       {"linear", {{"out_features", 3}}}});
  check_site_local(one_d, {"conv1d"});
  CHECK(site_local_note(one_d) ==
        "yes (probed); channel-local tail through relu, max_pool1d, flatten, into layer 4 "
        "(linear)");
  // A padded window wider than the map: every tap but the middle one reads padding.
  const Model narrow = spatial_model(
      Shape{{2, 3}}, {{"conv1d", {{"out_channels", 2}, {"kernel_size", 3}}},
                      {"avg_pool1d", {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}},
                      {"flatten", {}},
                      {"linear", {{"out_features", 3}}}});
  check_site_local(narrow, {"conv1d"});
  CHECK(site_local_note(narrow) ==
        "yes (probed); channel-local tail through avg_pool1d, flatten, into layer 3 (linear)");
  // A layer that mixes channels ends the tail: the suffix runs from the conv, still exact.
  const Model mixed = spatial_model(
      Shape{{2, 5, 5}}, {{"conv2d", {{"out_channels", 3}, {"kernel_size", 3}, {"padding", 1}}},
                         {"relu", {}},
                         {"conv2d", {{"out_channels", 2}, {"kernel_size", 3}}},
                         {"flatten", {}},
                         {"linear", {{"out_features", 3}}}});
  check_site_local(mixed, {"conv2d"});
  CHECK(site_local_note(mixed) ==
        "yes (probed); no channel-local tail: layer 2 (conv2d): it mixes channels or the tail "
        "does not know it");
}

TEST_CASE("cpu_tbb: site-local, conv2d with dilation, groups, no bias, and depthwise",
          "[cpu_tbb]") {
  const Model grouped = spatial_model(Shape{{4, 7, 8}}, {{"conv2d",
                                                          {{"out_channels", 6},
                                                           {"kernel_size", {2, 3}},
                                                           {"stride", {1, 2}},
                                                           {"padding", {1, 0}},
                                                           {"dilation", 2},
                                                           {"groups", 2},
                                                           {"bias", false}}},
                                                         {"relu", {}},
                                                         {"flatten", {}},
                                                         {"linear", {{"out_features", 3}}}});
  check_site_local(grouped, {"conv2d"});
  const Model depthwise = spatial_model(
      Shape{{3, 5, 5}},
      {{"conv2d", {{"out_channels", 3}, {"kernel_size", 3}, {"padding", 1}, {"groups", 3}}},
       {"relu", {}},
       {"conv2d", {{"out_channels", 2}, {"kernel_size", 2}, {"stride", 2}}},
       {"flatten", {}},
       {"linear", {{"out_features", 4}}}});
  check_site_local(depthwise, {"conv2d"});
}

TEST_CASE("cpu_tbb: site-local, conv1d with stride, padding, dilation, groups", "[cpu_tbb]") {
  const Model model = spatial_model(Shape{{4, 11}}, {{"conv1d",
                                                      {{"out_channels", 4},
                                                       {"kernel_size", 3},
                                                       {"stride", 2},
                                                       {"padding", 2},
                                                       {"dilation", 2},
                                                       {"groups", 2}}},
                                                     {"relu", {}},
                                                     {"max_pool1d", {{"kernel_size", 2}}},
                                                     {"flatten", {}},
                                                     {"linear", {{"out_features", 3}}}});
  check_site_local(model, {"conv1d"});
  const Model depthwise = spatial_model(
      Shape{{3, 9}}, {{"conv1d", {{"out_channels", 6}, {"kernel_size", 2}, {"groups", 3}}},
                      {"relu", {}},
                      {"conv1d", {{"out_channels", 2}, {"kernel_size", 3}, {"bias", false}}},
                      {"flatten", {}},
                      {"linear", {{"out_features", 3}}}});
  check_site_local(depthwise, {"conv1d"});
}

TEST_CASE("cpu_tbb: site-local, self-attention, softmax and argmax, causal or not, 2 heads",
          "[cpu_tbb]") {
  for (const char* weighting : {"softmax", "argmax"})
    for (const bool causal : {false, true}) {
      INFO(weighting << (causal ? ", causal" : ""));
      const Model model = spatial_model(
          Shape{{5, 8}},
          {{"self_attention", {{"num_heads", 2}, {"attention", weighting}, {"causal", causal}}},
           {"flatten", {}},
           {"linear", {{"out_features", 3}}}});
      check_site_local(model, {"self_attention"});
    }
  const Model no_bias =
      spatial_model(Shape{{4, 6}}, {{"self_attention", {{"num_heads", 2}, {"bias", false}}},
                                    {"relu", {}},
                                    {"self_attention", {{"num_heads", 3}}},
                                    {"flatten", {}},
                                    {"linear", {{"out_features", 3}}}});
  check_site_local(no_bias, {"self_attention"});
}

// Train's probe radius (0.1) moves few routes; radius 2 reroutes many tokens, whose rows the
// path recomputes with their new expert.
TEST_CASE("cpu_tbb: site-local, hard mixture of experts, through its tail or the suffix",
          "[cpu_tbb]") {
  for (const double radius : {0.1, 2.0}) {
    INFO("radius " << radius);
    const Model tail =
        spatial_model(Shape{{5, 6}}, {{"moe", {{"num_experts", 3}, {"out_features", 4}}},
                                      {"relu", {}},
                                      {"flatten", {}},
                                      {"linear", {{"out_features", 3}}}});
    check_site_local(tail, {"moe"}, radius);
    CHECK_THAT(site_local_note(tail),
               Catch::Matchers::EndsWith("the changed values through relu, flatten, into layer 3 "
                                         "(linear)'s output"));
    const Model smooth =
        spatial_model(Shape{{4, 5}}, {{"moe", {{"num_experts", 2}, {"out_features", 3}}},
                                      {"tanh", {}},
                                      {"flatten", {}},
                                      {"linear", {{"out_features", 4}}},
                                      {"relu", {}},
                                      {"linear", {{"out_features", 3}}}});
    check_site_local(smooth, {"moe"}, radius);
    // A second moe after the first: no feature tail, the suffix runs over every value.
    const Model stacked =
        spatial_model(Shape{{4, 6}}, {{"moe", {{"num_experts", 4}, {"out_features", 5}}},
                                      {"moe", {{"num_experts", 2}, {"out_features", 3}}},
                                      {"flatten", {}},
                                      {"linear", {{"out_features", 3}}}});
    check_site_local(stacked, {"moe"}, radius);
    CHECK_THAT(site_local_note(stacked),
               Catch::Matchers::Contains("no feature tail: layer 1 (moe) is not a "
                                         "verified elementwise layer"));
    const Model flat =
        spatial_model(Shape{{7}}, {{"moe", {{"num_experts", 3}, {"out_features", 5}}},
                                   {"relu", {}},
                                   {"linear", {{"out_features", 3}}}});
    check_site_local(flat, {"moe"}, radius);
  }
}

TEST_CASE("cpu_tbb: site-local, a particle spanning two layers declines and stays exact",
          "[cpu_tbb]") {
  const Model model =
      spatial_model(Shape{{2, 5, 5}}, {{"conv2d", {{"out_channels", 3}, {"kernel_size", 3}}},
                                       {"relu", {}},
                                       {"flatten", {}},
                                       {"linear", {{"out_features", 3}}}});
  const int64_t end = model.layer_offset(3);  // the linear layer's first parameter
  Candidates cands;
  cands.particles.d = 2;
  cands.particles.coords = {end - 1, end, 0, 1, end - 2, -1};
  for (const int64_t p : {0, 0, 1, 1, 2})
    for (int v = 0; v < 2; ++v) {
      cands.particle.push_back(p);
      cands.displacement.push_back(0.3 - 0.2 * v);
      cands.displacement.push_back(-0.1 * static_cast<double>(p) + 0.05);
    }
  const auto loss = make_loss("cross_entropy", 1e-3);
  const Batch batch = make_batch(model, 5);
  const Run ref = run_evaluator(model, *loss, batch, cands, request("reference", DType::f64));
  for (const std::string path : {"", "site-local"}) {
    INFO("path " << (path.empty() ? "auto" : path));
    const Run got = run_evaluator(model, *loss, batch, cands, request("cpu_tbb", DType::f64, path));
    CHECK(max_rel_diff(got.losses, ref.losses) < 1e-12);
    CHECK(candidates_on(got.explain, "site-local") == 6);  // particles 1 and 2
    CHECK(candidates_on(got.explain, "dense") == 4);       // particle 0
    CHECK(declined_for(got.explain, "site-local declined: the particle spans") == 4);
  }
}

TEST_CASE("cpu_tbb: site-local, attention particles across q/k/v rows, heads and out_proj",
          "[cpu_tbb]") {
  // E = 8, 2 heads: in_proj_weight [0, 192), in_proj_bias [192, 216), out_proj.weight
  // [216, 280), out_proj.bias [280, 288). Each particle mixes tensors; the first two move an
  // out_proj column of a head whose q/k/v also moves (the new mix feeds it).
  Candidates cands;
  cands.particles.d = 3;
  cands.particles.coords = {10, 259, 282, 205, 176, 223, 0, 73, 229};
  for (int64_t p = 0; p < 3; ++p)
    for (int v = 0; v < 3; ++v) {
      cands.particle.push_back(p);
      for (int k = 0; k < 3; ++k)
        cands.displacement.push_back(0.4 * std::sin(static_cast<double>(7 * p + 3 * v + k)));
    }
  for (const char* weighting : {"softmax", "argmax"})
    for (const bool causal : {false, true}) {
      const Model model = spatial_model(
          Shape{{5, 8}},
          {{"self_attention", {{"num_heads", 2}, {"attention", weighting}, {"causal", causal}}},
           {"flatten", {}},
           {"linear", {{"out_features", 3}}}});
      REQUIRE(model.layer_offset(1) == 288);
      const auto loss = make_loss("cross_entropy", 1e-3);
      const Batch batch = make_batch(model, 6);
      const Run ref = run_evaluator(model, *loss, batch, cands, request("reference", DType::f64));
      for (const DType dtype : {DType::f64, DType::f32}) {
        INFO(weighting << (causal ? ", causal, " : ", ") << to_string(dtype));
        const Run got = run_evaluator(model, *loss, batch, cands, request("cpu_tbb", dtype));
        CHECK(max_rel_diff(got.losses, ref.losses) < tolerance(dtype));
        CHECK(candidates_on(got.explain, "site-local") == 9);
      }
    }
}

// Delegates to a real conv2d, then bends the output: the per-site computation cannot match.
class BentConv final : public LayerBase<BentConv> {
 public:
  explicit BentConv(std::shared_ptr<const Layer> inner) : inner_(std::move(inner)) {}
  std::string kind() const override { return inner_->kind(); }
  nlohmann::json attributes() const override { return inner_->attributes(); }
  LayerContract contract() const override { return inner_->contract(); }
  std::vector<ParamSpec> parameters() const override { return inner_->parameters(); }
  const Shape& input_shape() const override { return inner_->input_shape(); }
  const Shape& output_shape() const override { return inner_->output_shape(); }
  void initialize(std::span<double> params, std::mt19937_64& rng) const override {
    inner_->initialize(params, rng);
  }
  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S> params, MatrixRef<S> y) const {
    inner_->forward(x, params, y);
    y = (y.array() + S(0.1) * y.array().square()).matrix();
  }

 private:
  std::shared_ptr<const Layer> inner_;
};

TEST_CASE("cpu_tbb: site-local, a layer whose forward differs from its kind fails the probe",
          "[cpu_tbb]") {
  const LayerFactory factory = LayerFactory::with_builtins();
  const auto conv =
      factory.create("conv2d", {{"out_channels", 2}, {"kernel_size", 3}}, Shape{{1, 5, 5}});
  const Model model =
      spatial_model(Shape{{1, 5, 5}},
                    {{"*", {}}, {"relu", {}}, {"flatten", {}}, {"linear", {{"out_features", 3}}}},
                    5, {std::make_shared<const BentConv>(conv)});
  const auto loss = make_loss("cross_entropy");
  const Batch batch = make_batch(model, 5);
  const Candidates cands = make_candidates(model.num_parameters(), 2, 3, 0.3);
  const Run ref = run_evaluator(model, *loss, batch, cands, request("reference", DType::f64));
  for (const std::string path : {"", "site-local"}) {
    const Run got = run_evaluator(model, *loss, batch, cands, request("cpu_tbb", DType::f64, path));
    CHECK(max_rel_diff(got.losses, ref.losses) < 1e-12);
    CHECK(candidates_on(got.explain, "site-local") == 0);
    CHECK(declined_for(got.explain, "site-local probe failed") == 10 * 3);  // 20 parameters
    CHECK(got.explain["plugin"]["layers"][0]["site_local"].get<std::string>().rfind(
              "site-local probe failed", 0) == 0);
  }
}

TEST_CASE("cpu_tbb: site-local, bit-identical for any thread count, and in chunks of 2",
          "[cpu_tbb]") {
  const Model conv = spatial_model(
      Shape{{2, 6, 6}},
      {{"conv2d", {{"out_channels", 3}, {"kernel_size", 3}, {"stride", 2}, {"padding", 1}}},
       {"relu", {}},
       {"flatten", {}},
       {"linear", {{"out_features", 3}}}});
  const Model attention = spatial_model(
      Shape{{4, 6}},
      {{"self_attention", {{"num_heads", 2}}}, {"flatten", {}}, {"linear", {{"out_features", 3}}}});
  const auto loss = make_loss("cross_entropy", 1e-3);
  for (const Model* model : {&conv, &attention}) {
    const Batch batch = make_batch(*model, 7);
    const Candidates cands = make_candidates(model->num_parameters(), 2, 5, 0.2);
    const Run ref = run_evaluator(*model, *loss, batch, cands, request("reference", DType::f64));
    for (const DType dtype : {DType::f32, DType::f64}) {
      INFO(model->layer(0).kind() << ", " << to_string(dtype));
      const Run one = run_evaluator(*model, *loss, batch, cands,
                                    request("cpu_tbb", dtype, "site-local", nullptr, 1));
      CHECK(candidates_on(one.explain, "site-local") > 0);
      for (const int threads : {2, 3}) {
        const Run many = run_evaluator(*model, *loss, batch, cands,
                                       request("cpu_tbb", dtype, "site-local", nullptr, threads));
        CHECK(many.losses == one.losses);
      }
      const Run chunked =
          run_evaluator(*model, *loss, batch, cands, request("cpu_tbb", dtype, "", nullptr, 2, 2));
      CHECK(chunked.explain["plugin"]["chunk_size"].get<int64_t>() == 2);
      CHECK(candidates_on(chunked.explain, "site-local") > 0);
      CHECK(max_rel_diff(chunked.losses, ref.losses) < tolerance(dtype));
    }
  }
}

}  // namespace
}  // namespace polyprobe::test
