// Linear: y = x Q(W)^T + Qb(b), applied over the last dimension of each sample.
//
// Q and Qb are elementwise weight transforms: identity (plain nn.Linear), sign (binarised
// weights), int8 or int4 (fake quantisation with a fixed step, symmetric: +-127 or +-7
// steps). The delta paths use the exact
// effective change Q(w + d) - Q(w), which is why the transforms are declared, not hidden.
#include "layers/builtin.hpp"

#include <cmath>

namespace polyprobe {
namespace {

enum class Transform { identity, sign, int8, int4 };

Transform parse_transform(const std::string& name) {
  if (name == "identity") return Transform::identity;
  if (name == "sign") return Transform::sign;
  if (name == "int8") return Transform::int8;
  if (name == "int4") return Transform::int4;
  throw Error("layer 'linear': unknown transform '" + name +
              "' (use identity, sign, int8 or int4)");
}

const char* transform_name(Transform t) {
  switch (t) {
    case Transform::identity:
      return "identity";
    case Transform::sign:
      return "sign";
    case Transform::int8:
      return "int8";
    case Transform::int4:
      return "int4";
  }
  return "identity";
}

class Linear final : public LayerBase<Linear> {
 public:
  Linear(const nlohmann::json& attrs, const Shape& input)
      : input_(input),
        out_(attr_required<int64_t>(attrs, "linear", "out_features")),
        bias_(attr_or<bool>(attrs, "linear", "bias", true)),
        weight_q_(
            parse_transform(attr_or<std::string>(attrs, "linear", "weight_transform", "identity"))),
        bias_q_(
            parse_transform(attr_or<std::string>(attrs, "linear", "bias_transform", "identity"))),
        step_(attr_or<double>(attrs, "linear", "quant_step", 1.0 / 64.0)) {
    check_attribute_names(
        attrs, "linear",
        {"out_features", "bias", "weight_transform", "bias_transform", "quant_step"});
    if (input_.dims.empty()) throw Error("layer 'linear': input has no dimensions");
    in_ = input_.dims.back();
    if (out_ <= 0) throw Error("layer 'linear': out_features must be positive");
    if (!(step_ > 0.0) || !std::isfinite(step_))
      throw Error("layer 'linear': quant_step must be a positive finite number");
    output_ = input_;
    output_.dims.back() = out_;
  }

  std::string kind() const override { return "linear"; }
  nlohmann::json attributes() const override {
    nlohmann::json a = {{"out_features", out_}, {"bias", bias_}};
    if (weight_q_ != Transform::identity) a["weight_transform"] = transform_name(weight_q_);
    if (bias_q_ != Transform::identity) a["bias_transform"] = transform_name(bias_q_);
    if (quantised(weight_q_) || quantised(bias_q_)) a["quant_step"] = step_;
    return a;
  }
  const Shape& input_shape() const override { return input_; }
  const Shape& output_shape() const override { return output_; }
  std::vector<ParamSpec> parameters() const override {
    std::vector<ParamSpec> specs{{"weight", {out_, in_}}};
    if (bias_) specs.push_back({"bias", {out_}});
    return specs;
  }
  LayerContract contract() const override {
    LayerContract c;
    // Applied to 1-D samples it is affine; over a longer sample it acts per position.
    c.affine = input_.dims.size() == 1;
    c.site_local = input_.dims.size() > 1;
    c.affine_has_bias = bias_;
    if (weight_q_ != Transform::identity) c.weight_transform = {&apply_weight_q, this};
    if (bias_q_ != Transform::identity) c.bias_transform = {&apply_bias_q, this};
    return c;
  }
  void initialize(std::span<double> params, std::mt19937_64& rng) const override {
    // PyTorch's default: kaiming_uniform(a = sqrt 5) gives U(-1/sqrt(in), 1/sqrt(in)), and
    // the bias the same bound.
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
    std::uniform_real_distribution<double> u(-bound, bound);
    for (double& p : params) p = u(rng);
  }

  template <class S>
  void forward_impl(ConstMatrixRef<S> x, std::span<const S> params, MatrixRef<S> y) const {
    const int64_t rows = x.rows() * (x.cols() / in_);
    Eigen::Map<const Matrix<S>> w(params.data(), out_, in_);
    const auto q_weight = [&](S v) { return quantise(weight_q_, v); };
    const auto q_bias = [&](S v) { return quantise(bias_q_, v); };
    auto run = [&](const auto& xin, auto&& yout) {
      if (weight_q_ == Transform::identity)
        yout.noalias() = xin * w.transpose();
      else
        yout.noalias() = xin * Matrix<S>(w.unaryExpr(q_weight)).transpose();
      if (bias_) {
        Eigen::Map<const Vector<S>> b(params.data() + out_ * in_, out_);
        if (bias_q_ == Transform::identity)
          yout.rowwise() += b.transpose();
        else
          yout.rowwise() += Vector<S>(b.unaryExpr(q_bias)).transpose();
      }
    };
    if (x.cols() == in_) {
      run(x, y);
    } else {
      // Positions of one sample are consecutive rows of a [rows, in] view.
      const Matrix<S> xc = x;
      Matrix<S> yc(rows, out_);
      run(Eigen::Map<const Matrix<S>>(xc.data(), rows, in_), yc);
      y = Eigen::Map<const Matrix<S>>(yc.data(), x.rows(), y.cols());
    }
  }

 private:
  template <class S>
  S quantise(Transform t, S v) const {
    return static_cast<S>(apply(t, static_cast<double>(v), step_));
  }
  static double apply(Transform t, double v, double step) {
    switch (t) {
      case Transform::identity:
        return v;
      case Transform::sign:
        return v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0);
      case Transform::int8:
        return std::clamp(std::nearbyint(v / step), -127.0, 127.0) * step;
      case Transform::int4:
        return std::clamp(std::nearbyint(v / step), -7.0, 7.0) * step;
    }
    return v;
  }
  static bool quantised(Transform t) { return t == Transform::int8 || t == Transform::int4; }
  static double apply_weight_q(const void* self, double v) {
    const auto* l = static_cast<const Linear*>(self);
    return apply(l->weight_q_, v, l->step_);
  }
  static double apply_bias_q(const void* self, double v) {
    const auto* l = static_cast<const Linear*>(self);
    return apply(l->bias_q_, v, l->step_);
  }

  Shape input_, output_;
  int64_t in_ = 0, out_ = 0;
  bool bias_ = true;
  Transform weight_q_, bias_q_;
  double step_;
};

}  // namespace

void register_linear(LayerFactory& factory) {
  factory.add("linear", {[](const nlohmann::json& attrs, const Shape& input) {
                           return std::make_shared<const Linear>(attrs, input);
                         },
                         "y = x Q(W)^T + Qb(b) over the last dimension (nn.Linear); "
                         "attributes out_features, bias, weight_transform, bias_transform",
                         "core"});
}

}  // namespace polyprobe
