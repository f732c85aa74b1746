// Hard top-1 mixture of experts over the last dimension of each sample (each position of a
// [L, D] sample is routed on its own): a router Linear D -> num_experts scores the experts,
// and the single best one (first on ties, torch.argmax) computes y = x W_e^T + b_e with
// out_features outputs. The output is not scaled by a gate: the routing is a hard, not
// differentiable choice, which gradient-free training handles as it is.
//
// Parameters, in order, with PyTorch's ModuleList names: router.weight [E, D], router.bias
// [E], then experts.i.weight [out, D] and experts.i.bias [out] for i = 0..E-1.
#include "layers/builtin.hpp"
#include "layers/ops.hpp"

namespace polyprobe {
namespace {

class HardMixture final : public LayerBase<HardMixture> {
 public:
  HardMixture(const nlohmann::json& attrs, const Shape& input) : input_(input) {
    check_attribute_names(attrs, "moe", {"num_experts", "out_features"});
    if (input.dims.empty()) throw Error("layer 'moe': input has no dimensions");
    in_ = input.dims.back();
    experts_ = attr_required<int64_t>(attrs, "moe", "num_experts");
    out_ = attr_or<int64_t>(attrs, "moe", "out_features", in_);
    if (experts_ < 1 || experts_ > 4096)
      throw Error("layer 'moe': num_experts must be between 1 and 4096");
    if (out_ <= 0) throw Error("layer 'moe': out_features must be positive");
    output_ = input_;
    output_.dims.back() = out_;
  }

  std::string kind() const override { return "moe"; }
  LayerContract contract() const override {
    LayerContract c;
    c.site_local = true;  // each position is routed and computed on its own
    return c;
  }
  nlohmann::json attributes() const override {
    return {{"num_experts", experts_}, {"out_features", out_}};
  }
  const Shape& input_shape() const override { return input_; }
  const Shape& output_shape() const override { return output_; }
  std::vector<ParamSpec> parameters() const override {
    std::vector<ParamSpec> specs{{"router.weight", {experts_, in_}}, {"router.bias", {experts_}}};
    for (int64_t e = 0; e < experts_; ++e) {
      specs.push_back({"experts." + std::to_string(e) + ".weight", {out_, in_}});
      specs.push_back({"experts." + std::to_string(e) + ".bias", {out_}});
    }
    return specs;
  }
  void initialize(std::span<double> params, std::mt19937_64& rng) const override {
    layers::fill_fan_in_uniform(params, in_, rng);
  }

  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S> params, MatrixRef<S> y) const {
    // Every position of every sample is one row of [rows, in]; route all rows with one
    // product, then run each expert once on the rows it won (gather, multiply, scatter).
    const Eigen::Index rows = x.rows() * (input_.numel() / in_);
    const Matrix<S> inputs = Eigen::Map<const Matrix<S>, 0, Eigen::OuterStride<>>(
        x.data(), x.rows(), x.cols(), Eigen::OuterStride<>(x.outerStride()));
    Eigen::Map<const Matrix<S>> all(inputs.data(), rows, in_);
    Eigen::Map<const Matrix<S>> router(params.data(), experts_, in_);
    Eigen::Map<const Vector<S>> router_bias(params.data() + experts_ * in_, experts_);
    Matrix<S> scores = all * router.transpose();
    scores.rowwise() += router_bias.transpose();
    std::vector<std::vector<Eigen::Index>> routed(static_cast<std::size_t>(experts_));
    for (Eigen::Index r = 0; r < rows; ++r) {
      Eigen::Index best = 0;
      for (Eigen::Index e = 1; e < experts_; ++e)
        if (scores(r, e) > scores(r, best)) best = e;  // the first maximum, as torch.argmax
      routed[static_cast<std::size_t>(best)].push_back(r);
    }
    Matrix<S> outputs(rows, out_);
    const S* expert_params = params.data() + experts_ * (in_ + 1);
    for (int64_t e = 0; e < experts_; ++e) {
      const auto& members = routed[static_cast<std::size_t>(e)];
      if (members.empty()) continue;
      const S* chosen = expert_params + e * out_ * (in_ + 1);
      Eigen::Map<const Matrix<S>> weight(chosen, out_, in_);
      Eigen::Map<const Vector<S>> bias(chosen + out_ * in_, out_);
      Matrix<S> gathered(static_cast<Eigen::Index>(members.size()), in_);
      for (std::size_t i = 0; i < members.size(); ++i)
        gathered.row(static_cast<Eigen::Index>(i)) = all.row(members[i]);
      Matrix<S> result = gathered * weight.transpose();
      result.rowwise() += bias.transpose();
      for (std::size_t i = 0; i < members.size(); ++i)
        outputs.row(members[i]) = result.row(static_cast<Eigen::Index>(i));
    }
    y = Eigen::Map<const Matrix<S>>(outputs.data(), x.rows(), y.cols());
  }

 private:
  Shape input_, output_;
  int64_t in_ = 0, out_ = 0, experts_ = 1;
};

}  // namespace

void register_moe(LayerFactory& factory) {
  factory.add("moe",
              {[](const nlohmann::json& attrs, const Shape& input) {
                 return std::make_shared<const HardMixture>(attrs, input);
               },
               "hard top-1 mixture of linear experts over the last dim (not differentiable); "
               "attributes num_experts, out_features",
               "core"});
}

}  // namespace polyprobe
