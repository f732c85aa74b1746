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
    Eigen::Map<const Matrix<S>> router(params.data(), experts_, in_);
    Eigen::Map<const Vector<S>> router_bias(params.data() + experts_ * in_, experts_);
    const S* expert_params = params.data() + experts_ * (in_ + 1);
    const int64_t expert_size = out_ * (in_ + 1);
    const int64_t positions = input_.numel() / in_;
    Vector<S> scores(experts_);
    for (Eigen::Index b = 0; b < x.rows(); ++b) {
      for (int64_t p = 0; p < positions; ++p) {
        Eigen::Map<const Vector<S>> v(layers::sample_in(x, b) + p * in_, in_);
        scores.noalias() = router * v + router_bias;
        Eigen::Index best = 0;
        for (Eigen::Index e = 1; e < scores.size(); ++e)
          if (scores(e) > scores(best)) best = e;
        const S* chosen = expert_params + best * expert_size;
        Eigen::Map<const Matrix<S>> weight(chosen, out_, in_);
        Eigen::Map<const Vector<S>> bias(chosen + out_ * in_, out_);
        Eigen::Map<Vector<S>>(layers::sample_out(y, b) + p * out_, out_).noalias() =
            weight * v + bias;
      }
    }
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
