// An example third-party plugin adding two layer kinds that the core lacks:
//
//   triangle_wave  elementwise, y = amplitude * tri(x / period), a periodic zigzag in
//                  [-amplitude, amplitude]; declares PP_CONTRACT_ELEMENTWISE with its scalar
//                  function, so delta paths may compute f(a + d) - f(a) directly.
//   feature_scale  y[i] = x[i] * scale[i], one learnable scale per feature (initialised to
//                  1); declares only PP_CONTRACT_PREFIX_REUSABLE, so evaluators treat it as
//                  a general layer.
//
// It uses nothing of polyprobe but the public plugin headers, and builds against an
// installed polyprobe with find_package(polyprobe CONFIG).
#include <polyprobe/plugin/plugin.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace {

nlohmann::json parse_attrs(std::string_view text, const char* kind) {
  nlohmann::json attrs = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!attrs.is_object())
    throw std::invalid_argument(std::string(kind) + ": attributes must be a JSON object");
  return attrs;
}

class TriangleWave {
 public:
  static std::unique_ptr<TriangleWave> create(std::string_view attrs_json,
                                              std::span<const int64_t> in_shape) {
    const nlohmann::json attrs = parse_attrs(attrs_json, "triangle_wave");
    for (const auto& [key, value] : attrs.items())
      if (key != "period" && key != "amplitude")
        throw std::invalid_argument("triangle_wave: unknown attribute '" + key +
                                    "' (period, amplitude)");
    auto layer = std::make_unique<TriangleWave>();
    layer->shape_.assign(in_shape.begin(), in_shape.end());
    layer->period_ = attrs.value("period", 2.0);
    layer->amplitude_ = attrs.value("amplitude", 1.0);
    if (!(layer->period_ > 0) || !std::isfinite(layer->period_))
      throw std::invalid_argument("triangle_wave: period must be a positive finite number");
    return layer;
  }

  void describe(pp_layer_info& info) const {
    pp::set_out_shape(info, shape_);
    info.contract = PP_CONTRACT_ELEMENTWISE | PP_CONTRACT_PREFIX_REUSABLE;
    info.elementwise_fn = &scalar;
    info.fn_ctx = this;
  }

  template <class T>
  void forward(std::span<const T> in, int64_t, std::span<const T>, std::span<T> out) const {
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = apply(in[i]);
  }

 private:
  // tri(u) = 4 |u - floor(u + 1/2)| - 1 has period 1 and range [-1, 1].
  template <class T>
  T apply(T x) const {
    const T u = x / static_cast<T>(period_);
    return static_cast<T>(amplitude_) * (T(4) * std::abs(u - std::floor(u + T(0.5))) - T(1));
  }
  static double scalar(const void* self, double x) {
    return static_cast<const TriangleWave*>(self)->apply(x);
  }

  std::vector<int64_t> shape_;
  double period_ = 2.0, amplitude_ = 1.0;
};

class FeatureScale {
 public:
  static std::unique_ptr<FeatureScale> create(std::string_view attrs_json,
                                              std::span<const int64_t> in_shape) {
    const nlohmann::json attrs = parse_attrs(attrs_json, "feature_scale");
    if (!attrs.empty()) throw std::invalid_argument("feature_scale: takes no attributes");
    auto layer = std::make_unique<FeatureScale>();
    layer->shape_.assign(in_shape.begin(), in_shape.end());
    layer->features_ = 1;
    for (int64_t d : in_shape) layer->features_ *= d;
    return layer;
  }

  void describe(pp_layer_info& info) const {
    pp::set_out_shape(info, shape_);
    info.n_params = 1;
    info.params[0] = pp::param_spec("scale", {features_});
    info.contract = PP_CONTRACT_PREFIX_REUSABLE;
  }

  template <class T>
  void forward(std::span<const T> in, int64_t batch, std::span<const T> params,
               std::span<T> out) const {
    if (static_cast<int64_t>(params.size()) != features_)
      throw std::invalid_argument("feature_scale: expected " + std::to_string(features_) +
                                  " parameters");
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < features_; ++i)
        out[b * features_ + i] = in[b * features_ + i] * params[i];
  }

  void init_params(uint64_t, std::span<double> params) const {
    for (double& p : params) p = 1.0;
  }

 private:
  std::vector<int64_t> shape_;
  int64_t features_ = 0;
};

constexpr pp_layer_kind kLayers[] = {
    pp::make_layer_kind<TriangleWave>("triangle_wave",
                                      "amplitude * periodic zigzag (attributes period, amplitude)"),
    pp::make_layer_kind<FeatureScale>("feature_scale", "one learnable scale per feature"),
};

constexpr pp_plugin make_plugin() {
  pp_plugin p{};
  p.api_version = PP_PLUGIN_API_VERSION;
  p.struct_size = sizeof(pp_plugin);
  p.name = "example_layers";
  p.version = "1.0.0";
  p.vendor = "polyprobe examples";
  p.summary = "two layer kinds the core lacks: triangle_wave and feature_scale";
  p.layers = kLayers;
  p.n_layers = 2;
  return p;
}

constexpr pp_plugin kPlugin = make_plugin();

}  // namespace

POLYPROBE_PLUGIN_EXPORT const pp_plugin* polyprobe_plugin_entry(uint32_t host_api_version) {
  return host_api_version == PP_PLUGIN_API_VERSION ? &kPlugin : nullptr;
}
