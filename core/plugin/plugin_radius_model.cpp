// A RadiusModel whose controller lives in a plugin (pp_radius_model_kind).
#include "plugin/plugin_impl.hpp"

#include "optimizer/state_io.hpp"

#include <polyprobe/radius_model.hpp>

#include <cmath>
#include <cstring>

namespace polyprobe::detail {
namespace {

class PluginRadiusModel final : public RadiusModel {
 public:
  PluginRadiusModel(const pp_radius_model_kind* kind, std::string plugin,
                    const pp_radius_config& config)
      : kind_(kind), plugin_(std::move(plugin)) {
    pp_error err{};
    if (kind_->create(&config, &self_, &err) != PP_OK || self_ == nullptr)
      throw Error("radius model '" + name() + "' (plugin " + plugin_ +
                  ") refuses this configuration: " + error_text(err));
  }
  ~PluginRadiusModel() override { kind_->destroy(self_); }
  PluginRadiusModel(const PluginRadiusModel&) = delete;
  PluginRadiusModel& operator=(const PluginRadiusModel&) = delete;

  RadiusModelKind kind() const override { return RadiusModelKind::plugin; }
  std::string name() const override { return kind_->name; }
  bool needs_incumbent() const override { return (kind_->flags & PP_RADIUS_NEEDS_INCUMBENT) != 0; }

  RadiusMultipliers multipliers() const override {
    RadiusMultipliers m;
    check(kind_->multipliers(self_, &m.step, &m.probe, &err_), "give its multipliers");
    if (!(m.step > 0) || !(m.probe > 0) || !std::isfinite(m.step) || !std::isfinite(m.probe))
      throw Error("radius model '" + name() + "' (plugin " + plugin_ +
                  ") gave the multipliers step " + std::to_string(m.step) + ", probe " +
                  std::to_string(m.probe) + "; they must be finite and positive");
    return m;
  }
  void observe_incumbent(double loss, bool comparable) override {
    if (kind_->observe_incumbent != nullptr)
      check(kind_->observe_incumbent(self_, loss, comparable ? 1 : 0, &err_), "observe f(X)");
  }
  double move_scale(const BlockModel& block) const override {
    if (kind_->move_scale == nullptr) return 1.0;
    double scale = 1.0;
    check(kind_->move_scale(self_, block.slope, block.curvature, &scale, &err_),
          "choose a step length");
    if (!std::isfinite(scale) || scale < 0)
      throw Error("radius model '" + name() + "' (plugin " + plugin_ + ") gave the step length " +
                  std::to_string(scale) + "; it must be finite and >= 0");
    return scale;
  }
  void record_prediction(double predicted_change, bool at_boundary) override {
    if (kind_->record_prediction != nullptr)
      check(kind_->record_prediction(self_, predicted_change, at_boundary ? 1 : 0, &err_),
            "record a prediction");
  }
  void observe_costs(double mean_cost) override {
    if (kind_->observe_costs != nullptr)
      check(kind_->observe_costs(self_, mean_cost, &err_), "observe the costs");
  }
  void invalidate() override {
    if (kind_->invalidate != nullptr) kind_->invalidate(self_);
  }

  // The plugin's bytes, as hexadecimal text after the model's name, so a checkpoint of
  // another model fails by name before the plugin sees foreign bytes.
  void save(std::ostream& out) const override {
    int64_t size = 0;
    check(kind_->save(self_, nullptr, 0, &size, &err_), "measure its state");
    std::vector<uint8_t> bytes(static_cast<std::size_t>(std::max<int64_t>(size, 0)));
    int64_t written = 0;
    check(kind_->save(self_, bytes.data(), size, &written, &err_), "save its state");
    if (written != size)
      throw Error("radius model '" + name() + "' (plugin " + plugin_ + ") wrote " +
                  std::to_string(written) + " bytes of state after announcing " +
                  std::to_string(size));
    state_io::put_tag(out, "radius.plugin");
    out << name() << '\n';
    state_io::put_tag(out, "radius.state");
    static constexpr char kHex[] = "0123456789abcdef";
    std::string text;
    text.reserve(bytes.size() * 2);
    for (const uint8_t b : bytes) text += {kHex[b >> 4], kHex[b & 15]};
    out << bytes.size() << ' ' << (text.empty() ? "-" : text) << '\n';
  }
  void load(std::istream& in) override {
    state_io::expect_tag(in, "radius.plugin");
    std::string saved;
    in >> saved;
    if (saved != name())
      throw Error("optimizer checkpoint: written with radius model '" + saved +
                  "', this run uses '" + name() + "'; resume with --radius-model " + saved);
    state_io::expect_tag(in, "radius.state");
    std::size_t size = 0;
    std::string text;
    if (!(in >> size >> text) || (size == 0 ? text != "-" : text.size() != 2 * size))
      throw Error("optimizer checkpoint: the state of radius model '" + name() + "' is damaged");
    std::vector<uint8_t> bytes(size);
    const auto nibble = [&](char c) -> uint8_t {
      if (c >= '0' && c <= '9') return static_cast<uint8_t>(c - '0');
      if (c >= 'a' && c <= 'f') return static_cast<uint8_t>(c - 'a' + 10);
      throw Error("optimizer checkpoint: the state of radius model '" + name() + "' is damaged");
    };
    for (std::size_t i = 0; i < size; ++i)
      bytes[i] = static_cast<uint8_t>(nibble(text[2 * i]) << 4 | nibble(text[2 * i + 1]));
    check(kind_->load(self_, bytes.data(), static_cast<int64_t>(size), &err_),
          "restore its checkpointed state");
  }

 private:
  void check(int status, const char* what) const {
    if (status != PP_OK)
      throw Error("radius model '" + name() + "' (plugin " + plugin_ + ") failed to " + what +
                  ": " + error_text(err_));
  }
  const pp_radius_model_kind* kind_;
  std::string plugin_;
  void* self_ = nullptr;
  mutable pp_error err_{};
};

}  // namespace

std::unique_ptr<RadiusModel> make_plugin_radius_model(const pp_radius_model_kind* kind,
                                                      const std::string& plugin,
                                                      const pp_radius_config& config) {
  return std::make_unique<PluginRadiusModel>(kind, plugin, config);
}

}  // namespace polyprobe::detail
