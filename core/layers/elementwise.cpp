// Parameter-free elementwise activations: y[i] = f(x[i]).
//
// Continuity is not required: the delta paths compute f(a + delta) - f(a) exactly, so the
// step-like activations (sign, staircase) that gradients cannot train are first-class.
#include "layers/builtin.hpp"

#include <polyprobe/plugin/kernels/activations.hpp>

#include <cmath>
#include <numbers>

namespace polyprobe {
namespace {

enum class Op { relu, gelu, gelu_tanh, tanh, sign, staircase, identity };

class Elementwise final : public LayerBase<Elementwise> {
 public:
  Elementwise(std::string kind, Op op, const Shape& input, double step)
      : kind_(std::move(kind)), op_(op), shape_(input), step_(step) {}

  std::string kind() const override { return kind_; }
  nlohmann::json attributes() const override {
    if (op_ == Op::gelu_tanh) return {{"approximate", "tanh"}};
    if (op_ == Op::staircase) return {{"step", step_}};
    return nlohmann::json::object();
  }
  const Shape& input_shape() const override { return shape_; }
  const Shape& output_shape() const override { return shape_; }
  LayerContract contract() const override {
    LayerContract c;
    c.elementwise = true;
    c.elementwise_fn = {&apply_fn, this};
    return c;
  }

  // f in double; the forward evaluates the same expression in S.
  double apply(double x) const { return eval(x); }

  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S>, MatrixRef<S> y) const {
    switch (op_) {
      case Op::relu:
        y = x.cwiseMax(S(0));
        break;
      case Op::tanh:
        y = x.array().tanh().matrix();
        break;
      case Op::sign:  // the cheap functions without a switch per value
        y = x.unaryExpr([](S v) { return kernels::sign(v); });
        break;
      case Op::staircase:
        y = x.unaryExpr(
            [step = static_cast<S>(step_)](S v) { return kernels::staircase(v, step); });
        break;
      default:
        y = x.unaryExpr([this](S v) { return eval(v); });
        break;
    }
  }

 private:
  template <class S>
  S eval(S v) const {
    switch (op_) {
      case Op::relu:
        return kernels::relu(v);
      case Op::gelu:
        return kernels::gelu(v);
      case Op::gelu_tanh:
        return kernels::gelu_tanh(v);
      case Op::tanh:
        return std::tanh(v);
      case Op::sign:
        return kernels::sign(v);
      case Op::staircase:
        return kernels::staircase(v, static_cast<S>(step_));
      case Op::identity:
        return v;
    }
    return v;
  }
  static double apply_fn(const void* self, double x) {
    return static_cast<const Elementwise*>(self)->apply(x);
  }

  std::string kind_;
  Op op_;
  Shape shape_;
  double step_;
};

void add(LayerFactory& factory, const char* kind, Op op, const char* summary) {
  factory.add(kind, {[kind, op](const nlohmann::json& attrs, const Shape& input) {
                       check_attribute_names(attrs, kind, {});
                       return std::make_shared<const Elementwise>(kind, op, input, 1.0);
                     },
                     summary, "core"});
}

}  // namespace

void register_elementwise(LayerFactory& factory) {
  add(factory, "relu", Op::relu, "max(x, 0)");
  add(factory, "tanh", Op::tanh, "tanh(x)");
  add(factory, "sign", Op::sign, "sign(x) in {-1, 0, 1} (not differentiable)");
  add(factory, "identity", Op::identity, "x");
  factory.add("gelu", {[](const nlohmann::json& attrs, const Shape& input) {
                         check_attribute_names(attrs, "gelu", {"approximate"});
                         const auto approx =
                             attr_or<std::string>(attrs, "gelu", "approximate", "none");
                         if (approx != "none" && approx != "tanh")
                           throw Error("layer 'gelu': approximate must be \"none\" or \"tanh\"");
                         return std::make_shared<const Elementwise>(
                             "gelu", approx == "tanh" ? Op::gelu_tanh : Op::gelu, input, 1.0);
                       },
                       "GELU, exact (erf) or approximate = \"tanh\" (nn.GELU)", "core"});
  factory.add(
      "staircase",
      {[](const nlohmann::json& attrs, const Shape& input) {
         check_attribute_names(attrs, "staircase", {"step"});
         const double step = attr_or<double>(attrs, "staircase", "step", 0.25);
         if (!(step > 0.0) || !std::isfinite(step))
           throw Error("layer 'staircase': step must be a positive finite number");
         return std::make_shared<const Elementwise>("staircase", Op::staircase, input, step);
       },
       "step * floor(x / step) (not differentiable); attribute step (default 0.25)", "core"});
}

}  // namespace polyprobe
