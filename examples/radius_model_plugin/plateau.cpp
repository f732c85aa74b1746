// An example third-party radius model: "plateau", the learning-rate-on-plateau rule applied
// to polyprobe's radii (which are its learning rate).
//
// It keeps the best mean candidate cost seen. A step whose mean cost is not below
// best * (1 - threshold) counts as stagnant; after `patience` stagnant steps in a row both
// radii shrink by `factor`, down to `min_multiplier`, and the count restarts. Options come
// from --radius-options as JSON: {"patience": 20, "factor": 0.5, "threshold": 1e-3,
// "min_multiplier": 0.05}; unknown keys and values outside their range are refused with the
// reason. Its checkpoint state is four numbers; resuming continues bit for bit.
//
// It uses nothing of polyprobe but the public plugin headers, and builds against an
// installed polyprobe with find_package(polyprobe CONFIG).
#include <polyprobe/plugin/plugin.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace {

class Plateau {
 public:
  explicit Plateau(const pp_radius_config& config) {
    const auto options = nlohmann::json::parse(
        config.options_json != nullptr ? config.options_json : "{}", nullptr, false);
    if (!options.is_object())
      throw std::invalid_argument("plateau: --radius-options must be a JSON object, got '" +
                                  std::string(config.options_json) + "'");
    for (const auto& [key, value] : options.items()) {
      if (key != "patience" && key != "factor" && key != "threshold" && key != "min_multiplier")
        throw std::invalid_argument("plateau: unknown option '" + key +
                                    "' (patience, factor, threshold, min_multiplier)");
      if (!value.is_number())
        throw std::invalid_argument("plateau: option '" + key + "' must be a number");
    }
    patience_ = options.value("patience", int64_t{20});
    factor_ = options.value("factor", 0.5);
    threshold_ = options.value("threshold", 1e-3);
    min_multiplier_ = options.value("min_multiplier", 0.05);
    if (patience_ < 1) throw std::invalid_argument("plateau: patience must be at least 1");
    if (!(factor_ > 0 && factor_ < 1))
      throw std::invalid_argument("plateau: factor must be in (0, 1)");
    if (!(threshold_ >= 0 && threshold_ < 1))
      throw std::invalid_argument("plateau: threshold must be in [0, 1)");
    if (!(min_multiplier_ > 0 && min_multiplier_ <= 1))
      throw std::invalid_argument("plateau: min_multiplier must be in (0, 1]");
  }

  double multiplier() const { return state_.multiplier; }

  void observe_costs(double mean_cost) {
    if (!std::isfinite(mean_cost)) return;  // a failed step says nothing about progress
    if (state_.has_best == 0 || mean_cost < state_.best * (1 - threshold_)) {
      state_.best = mean_cost;
      state_.has_best = 1;
      state_.stagnant = 0;
      return;
    }
    if (++state_.stagnant >= patience_) {
      state_.multiplier = std::max(state_.multiplier * factor_, min_multiplier_);
      state_.stagnant = 0;
    }
  }

  // The state as its bytes: plain numbers, no pointers.
  struct State {
    double multiplier = 1.0;
    double best = 0;
    int64_t stagnant = 0;
    int64_t has_best = 0;
  };
  State state_;

 private:
  int64_t patience_;
  double factor_, threshold_, min_multiplier_;
};

Plateau& self_of(void* self) { return *static_cast<Plateau*>(self); }
const Plateau& self_of(const void* self) { return *static_cast<const Plateau*>(self); }

int create(const pp_radius_config* config, void** self, pp_error* err) {
  try {
    *self = new Plateau(*config);
    return PP_OK;
  } catch (const std::invalid_argument& e) {
    pp::set_error(err, e.what());
    return PP_UNSUPPORTED;
  } catch (const std::exception& e) {
    pp::set_error(err, e.what());
    return PP_FAILED;
  }
}
void destroy(void* self) { delete static_cast<Plateau*>(self); }
int multipliers(const void* self, double* step, double* probe, pp_error* err) {
  return pp::guard(err, [&] { *step = *probe = self_of(self).multiplier(); });
}
int observe_costs(void* self, double mean_cost, pp_error* err) {
  return pp::guard(err, [&] { self_of(self).observe_costs(mean_cost); });
}
int save(const void* self, uint8_t* data, int64_t capacity, int64_t* size, pp_error* err) {
  return pp::guard(err, [&] {
    *size = sizeof(Plateau::State);
    if (data != nullptr && capacity >= *size)
      std::memcpy(data, &self_of(self).state_, sizeof(Plateau::State));
  });
}
int load(void* self, const uint8_t* data, int64_t size, pp_error* err) {
  return pp::guard(err, [&] {
    if (size != sizeof(Plateau::State))
      throw std::invalid_argument("plateau: a state of " + std::to_string(size) +
                                  " bytes is not one of mine (" +
                                  std::to_string(sizeof(Plateau::State)) + ")");
    std::memcpy(&self_of(self).state_, data, sizeof(Plateau::State));
  });
}

constexpr pp_radius_model_kind make_model() {
  pp_radius_model_kind k{};  // the optional calls this model does not need stay NULL
  k.struct_size = sizeof(pp_radius_model_kind);
  k.name = "plateau";
  k.summary = "shrink both radii by a factor after `patience` steps without a lower mean cost";
  k.create = &create;
  k.destroy = &destroy;
  k.multipliers = &multipliers;
  k.observe_costs = &observe_costs;
  k.save = &save;
  k.load = &load;
  return k;
}

constexpr pp_radius_model_kind kModels[] = {make_model()};

constexpr pp_plugin make_plugin() {
  pp_plugin p{};
  p.api_version = PP_PLUGIN_API_VERSION;
  p.struct_size = sizeof(pp_plugin);
  p.name = "plateau";
  p.version = "1.0.0";
  p.summary = "the plateau radius model: --radius-model plateau";
  p.radius_models = kModels;
  p.n_radius_models = 1;
  return p;
}

constexpr pp_plugin kPlugin = make_plugin();

}  // namespace

POLYPROBE_PLUGIN_EXPORT const pp_plugin* polyprobe_plugin_entry(uint32_t host_api_version) {
  return host_api_version == PP_PLUGIN_API_VERSION ? &kPlugin : nullptr;
}
