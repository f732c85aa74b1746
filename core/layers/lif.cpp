// A leaky integrate-and-fire (LIF) spiking layer unrolled over T steps.
//
// Each input value is a constant current I fed to its own neuron for `steps` steps:
//   v_t = beta * v_{t-1} + I,  s_t = [v_t >= threshold],  v_t -= s_t * threshold (reset
//   "subtract") or v_t *= 1 - s_t (reset "zero"),  v_0 = 0,
// and the output is the firing rate sum_t s_t / T. Neurons do not interact and have no
// parameters, so the layer is elementwise: a staircase-like function of the current that no
// gradient can train through, and that the delta paths evaluate exactly. Put a linear layer
// before it to make the currents trainable.
#include "layers/builtin.hpp"

#include <polyprobe/plugin/kernels/lif.hpp>

namespace polyprobe {
namespace {

class LeakyIntegrateFire final : public LayerBase<LeakyIntegrateFire> {
 public:
  LeakyIntegrateFire(const nlohmann::json& attrs, const Shape& input) : shape_(input) {
    check_attribute_names(attrs, "lif", {"steps", "beta", "threshold", "reset"});
    steps_ = attr_or<int64_t>(attrs, "lif", "steps", 8);
    beta_ = attr_or<double>(attrs, "lif", "beta", 0.9);
    threshold_ = attr_or<double>(attrs, "lif", "threshold", 1.0);
    const auto reset = attr_or<std::string>(attrs, "lif", "reset", "subtract");
    if (reset != "subtract" && reset != "zero")
      throw Error("layer 'lif': reset must be \"subtract\" or \"zero\"");
    reset_to_zero_ = reset == "zero";
    if (steps_ < 1 || steps_ > 10000) throw Error("layer 'lif': steps must be between 1 and 10000");
    if (!(beta_ >= 0.0 && beta_ <= 1.0)) throw Error("layer 'lif': beta must be in [0, 1]");
    if (!(threshold_ > 0.0) || !std::isfinite(threshold_))
      throw Error("layer 'lif': threshold must be a positive finite number");
  }

  std::string kind() const override { return "lif"; }
  nlohmann::json attributes() const override {
    return {{"steps", steps_},
            {"beta", beta_},
            {"threshold", threshold_},
            {"reset", reset_to_zero_ ? "zero" : "subtract"}};
  }
  const Shape& input_shape() const override { return shape_; }
  const Shape& output_shape() const override { return shape_; }
  LayerContract contract() const override {
    LayerContract c;
    c.elementwise = true;
    c.elementwise_fn = {&rate_fn, this};
    return c;
  }

  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S>, MatrixRef<S> y) const {
    for (Eigen::Index r = 0; r < x.rows(); ++r) rates(x.row(r).data(), y.row(r).data(), x.cols());
  }

 private:
  // The firing rates of neurons driven by constant currents, in the precision S.
  template <class S>
  void rates(const S* current, S* rate, int64_t count) const {
    kernels::lif_rates(current, rate, count, steps_, static_cast<S>(beta_),
                       static_cast<S>(threshold_), reset_to_zero_);
  }
  static double rate_fn(const void* self, double x) {
    double rate = 0;
    static_cast<const LeakyIntegrateFire*>(self)->rates(&x, &rate, 1);
    return rate;
  }

  Shape shape_;
  int64_t steps_ = 8;
  double beta_ = 0.9, threshold_ = 1.0;
  bool reset_to_zero_ = false;
};

}  // namespace

void register_lif(LayerFactory& factory) {
  factory.add("lif", {[](const nlohmann::json& attrs, const Shape& input) {
                        return std::make_shared<const LeakyIntegrateFire>(attrs, input);
                      },
                      "leaky integrate-and-fire neurons, constant current over T steps, output the "
                      "firing rate (not differentiable); attributes steps, beta, threshold, reset",
                      "core"});
}

}  // namespace polyprobe
