// OptimizerConfig for Python: one table of options (name, getter, setter, help) drives the
// keyword constructor, the properties, to_dict() and the dict form every API accepts.
// Names are the C++ field names; the radius model's fields sit at the top level, its kind
// as `radius_model` (as `polyprobe train --radius-model` spells it). Enumerations are strings.
#include "bindings.hpp"

#include <polyprobe/minimize.hpp>

#include <pybind11/stl.h>

#include <sstream>

namespace polyprobe::python {
namespace {

struct Option {
  std::string name;
  std::string help;
  std::function<py::object(const OptimizerConfig&)> get;
  std::function<void(OptimizerConfig&, py::handle)> set;
};

std::string type_name(py::handle value) {
  return py::str(py::type::handle_of(value).attr("__name__"));
}

template <class T>
T take(py::handle value, const std::string& name) {
  const bool is_bool = PyBool_Check(value.ptr());
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>)
    ok = is_bool;
  else if constexpr (std::is_integral_v<T>)
    ok = !is_bool && PyIndex_Check(value.ptr());
  else
    ok = !is_bool && (PyFloat_Check(value.ptr()) || PyIndex_Check(value.ptr()) ||
                      py::isinstance(value, py::module_::import("numbers").attr("Real")));
  if (!ok) {
    const char* want = std::is_same_v<T, bool> ? "a bool"
                       : std::is_integral_v<T> ? "an int"
                                               : "a number";
    throw BadInput("option '" + name + "' must be " + want + ", got " + type_name(value));
  }
  try {
    return value.cast<T>();
  } catch (const py::cast_error&) {
    throw BadInput("option '" + name + "' is out of range for its type");
  }
}

template <class T, class Owner>
Option field(std::string name, T Owner::*member, std::string help) {
  Option o{name, std::move(help), nullptr, nullptr};
  auto owner = [](auto& config) -> auto& {
    if constexpr (std::is_same_v<Owner, OptimizerConfig>)
      return config;
    else
      return config.radius;
  };
  o.get = [member, owner](const OptimizerConfig& c) { return py::cast(owner(c).*member); };
  o.set = [member, owner, name](OptimizerConfig& c, py::handle v) {
    owner(c).*member = take<T>(v, name);
  };
  return o;
}

template <class E, class Owner, class Parse, class Print>
Option choice(std::string name, E Owner::*member, Parse parse, Print print, std::string help) {
  Option o{name, std::move(help), nullptr, nullptr};
  auto owner = [](auto& config) -> auto& {
    if constexpr (std::is_same_v<Owner, OptimizerConfig>)
      return config;
    else
      return config.radius;
  };
  o.get = [member, owner, print](const OptimizerConfig& c) {
    return py::cast(std::string(print(owner(c).*member)));
  };
  o.set = [member, owner, parse, name](OptimizerConfig& c, py::handle v) {
    if (!py::isinstance<py::str>(v))
      throw BadInput("option '" + name + "' must be a string, got " + type_name(v));
    try {
      owner(c).*member = parse(v.cast<std::string>());
    } catch (const Error& e) {
      throw BadInput("option '" + name + "': " + e.what());
    }
  };
  return o;
}

RotationMethod parse_rotation(std::string_view s) {
  if (s == "auto" || s == "automatic") return RotationMethod::automatic;
  if (s == "qr") return RotationMethod::qr;
  if (s == "householder") return RotationMethod::householder;
  throw Error("unknown rotation '" + std::string(s) + "' (auto, qr or householder)");
}
std::string_view rotation_name(RotationMethod r) {
  return r == RotationMethod::qr ? "qr" : r == RotationMethod::householder ? "householder" : "auto";
}

const std::vector<Option>& options() {
  using C = OptimizerConfig;
  using R = RadiusModelSettings;
  auto poly = [](std::string_view s) { return parse_polytope(s); };
  auto poly_s = [](PolytopeKind k) { return to_string(k); };
  static const std::vector<Option> table = {
      field("particle_dim", &C::particle_dim, "coordinates per particle (d)"),
      field("subspace_particle_dim", &C::subspace_particle_dim, "d when searching a subspace"),
      field("subspace_rotation_interval", &C::subspace_rotation_interval,
            "redraw the subspace's bases every N steps (0: never)"),
      choice("polytope", &C::polytope, poly, poly_s, "simplex, orthoplex or cube"),
      field("num_probe", &C::num_probe, "probe radii k / (K + 1), k = 1 .. K"),
      choice("rotation", &C::rotation, parse_rotation, rotation_name, "auto, qr or householder"),
      field("biased_rotation", &C::biased_rotation, "first axis along the last move"),
      choice(
          "metric", &C::metric, [](std::string_view s) { return parse_metric(s); },
          [](MetricKind k) { return to_string(k); }, "identity or bfgs (learned metric)"),
      field("step_radius", &C::step_radius, "step radius"),
      field("probe_radius", &C::probe_radius, "probe radius"),
      choice(
          "schedule", &C::schedule, [](std::string_view s) { return parse_schedule(s); },
          [](ScheduleKind k) { return to_string(k); },
          "constant, linear, cosine, power or progressive"),
      field("epsilon", &C::epsilon, "radius scale and transport temperature"),
      field("epsilon_final", &C::epsilon_final, "final epsilon (linear, cosine)"),
      field("total_steps", &C::total_steps, "length of the linear/cosine schedules"),
      field("schedule_decay_steps", &C::schedule_decay_steps, "power schedule"),
      field("schedule_power", &C::schedule_power, "power schedule"),
      field("schedule_decay_rate", &C::schedule_decay_rate, "progressive schedule"),
      choice(
          "solver", &C::solver, [](std::string_view s) { return parse_transport_solver(s); },
          [](TransportSolver k) { return to_string(k); },
          "auto, sinkhorn, softmax, greedy or top_k"),
      field("ent_epsilon", &C::ent_epsilon, "> 0: transport temperature independent of radii"),
      field("sinkhorn_max_iterations", &C::sinkhorn_max_iterations, "Sinkhorn iteration cap"),
      field("sinkhorn_tolerance", &C::sinkhorn_tolerance, "Sinkhorn marginal tolerance"),
      field("top_k", &C::top_k, "k of the top_k solver"),
      choice(
          "cost_scaling", &C::cost_scaling,
          [](std::string_view s) { return parse_cost_scaling(s); },
          [](CostScaling k) { return to_string(k); }, "none, mean, max_cost or min_max"),
      field("nonfinite_margin", &C::nonfinite_margin, "non-finite cost -> max finite + margin"),
      choice(
          "blocks", &C::blocks, [](std::string_view s) { return parse_block_strategy(s); },
          [](BlockStrategy k) { return to_string(k); }, "monolithic, per_layer or grouped"),
      field("block_group_size", &C::block_group_size, "grouped: parameter tensors per block"),
      field("momentum", &C::momentum, "heavy-ball momentum"),
      field("momentum_init", &C::momentum_init, "momentum at step 0"),
      field("momentum_final", &C::momentum_final, "momentum after total_steps"),
      field("velocity_lr", &C::velocity_lr, "velocity learning rate"),
      choice(
          "radius_model", &R::kind, [](std::string_view s) { return parse_radius_model(s); },
          [](RadiusModelKind k) { return to_string(k); },
          "fixed, adaptive, quadratic or trust_region"),
      field("stagnation_threshold", &R::stagnation_threshold, "adaptive: relative change"),
      field("stagnation_patience", &R::stagnation_patience, "adaptive: stagnant steps"),
      field("radius_increase", &R::radius_increase, "adaptive: growth factor"),
      field("radius_decrease", &R::radius_decrease, "adaptive: shrink factor"),
      field("radius_min", &R::radius_min, "multiplier lower bound"),
      field("radius_max", &R::radius_max, "multiplier upper bound"),
      field("quadratic_max_scale", &R::quadratic_max_scale, "quadratic: longest step"),
      field("trust_shrink_below", &R::trust_shrink_below, "trust_region: shrink ratio"),
      field("trust_grow_above", &R::trust_grow_above, "trust_region: grow ratio"),
      field("trust_shrink", &R::trust_shrink, "trust_region: shrink factor"),
      field("trust_grow", &R::trust_grow, "trust_region: grow factor"),
      field("trust_min", &R::trust_min, "trust_region: multiplier lower bound"),
      field("trust_max", &R::trust_max, "trust_region: multiplier upper bound"),
      field("trust_scales_probe", &R::trust_scales_probe, "trust_region: probe follows"),
      field("trust_reject", &R::trust_reject, "trust_region: undo failed steps"),
      field("adaptive_probes", &C::adaptive_probes, "reuse stagnant particles' costs"),
      field("adaptive_probes_threshold", &C::adaptive_probes_threshold, "stagnant move norm^2"),
      field("amortize_steps", &C::amortize_steps, "k - 1 momentum-only steps between scored"),
      field("amortize_ema", &C::amortize_ema, "decay of momentum-only steps"),
      field("multifidelity_screen", &C::multifidelity_screen, "screen on part of the batch"),
      field("screen_fidelity", &C::screen_fidelity, "batch fraction of the screen"),
      field("screen_keep_ratio", &C::screen_keep_ratio, "vertices promoted"),
      field("seed", &C::seed, "random seed"),
  };
  return table;
}

const Option& find_option(const std::string& name) {
  for (const Option& o : options())
    if (o.name == name) return o;
  std::string known;
  for (const Option& o : options()) known += (known.empty() ? "" : ", ") + o.name;
  throw BadInput("unknown optimizer option '" + name + "' (known: " + known + ")");
}

void apply(OptimizerConfig& config, const py::dict& values) {
  for (auto [key, value] : values) {
    if (!py::isinstance<py::str>(key)) throw BadInput("optimizer option names must be strings");
    find_option(key.cast<std::string>()).set(config, value);
  }
}

}  // namespace

py::dict config_dict(const OptimizerConfig& config) {
  py::dict d;
  for (const Option& o : options()) d[py::str(o.name)] = o.get(config);
  return d;
}

OptimizerConfig to_config(py::handle config) {
  OptimizerConfig c;
  if (config.is_none()) return c;
  if (py::isinstance<OptimizerConfig>(config)) {
    c = config.cast<OptimizerConfig>();
  } else if (py::isinstance<py::dict>(config)) {
    apply(c, config.cast<py::dict>());
  } else {
    throw BadInput("config must be a polyprobe.OptimizerConfig, a dict of options or None, got " +
                   type_name(config));
  }
  bad_input([&] { c.validate(); });
  return c;
}

void bind_config(py::module_& m) {
  py::class_<OptimizerConfig> cls(m, "OptimizerConfig", R"doc(
The polytope optimizer's options (docs/optimizer.md). Every option has polystep's default;
pass any of them as keywords: ``OptimizerConfig(particle_dim=4, solver="softmax")``.
Enumerations are strings. An unknown name or a bad value is a ValueError; ``validate()``
checks the combination (the APIs that take a config call it).)doc");
  cls.def(py::init([](const py::kwargs& kw) {
            OptimizerConfig c;
            apply(c, kw);
            return c;
          }),
          "OptimizerConfig(**options): polystep's defaults, overridden by `options`.")
      .def(
          "validate", [](const OptimizerConfig& c) { bad_input([&] { c.validate(); }); },
          "Raises ValueError naming the first broken rule and how to fix it.")
      .def("to_dict", &config_dict, "Every option as {name: value}.")
      .def(
          "replace",
          [](const OptimizerConfig& c, const py::kwargs& kw) {
            OptimizerConfig out = c;
            apply(out, kw);
            return out;
          },
          "A copy with `options` changed.")
      .def_static(
          "options",
          [] {
            py::dict d;
            for (const Option& o : options()) d[py::str(o.name)] = o.help;
            return d;
          },
          "Every option name with a one-line help.")
      .def("__eq__", [](const OptimizerConfig& a,
                        const OptimizerConfig& b) { return config_dict(a).equal(config_dict(b)); })
      .def("__repr__",
           [](const OptimizerConfig& c) {
             // Only what differs from the defaults, like a dataclass with defaults elided.
             const py::dict d = config_dict(c), base = config_dict(OptimizerConfig{});
             std::ostringstream s;
             s << "OptimizerConfig(";
             bool first = true;
             for (auto [k, v] : d)
               if (!v.equal(py::object(base[k]))) {
                 s << (first ? "" : ", ") << std::string(py::str(k)) << "="
                   << std::string(py::repr(v));
                 first = false;
               }
             s << ")";
             return s.str();
           })
      .def(py::pickle([](const OptimizerConfig& c) { return config_dict(c); },
                      [](const py::dict& d) {
                        OptimizerConfig c;
                        apply(c, d);
                        return c;
                      }));
  for (const Option& o : options()) {
    const std::string name = o.name;
    cls.def_property(
        name.c_str(), [name](const OptimizerConfig& c) { return find_option(name).get(c); },
        [name](OptimizerConfig& c, py::handle v) { find_option(name).set(c, v); }, o.help.c_str());
  }
  m.def(
      "recommended_minimize_config",
      [](int n) {
        if (n <= 0) throw BadInput("recommended_minimize_config: n must be positive");
        return recommended_minimize_config(n);
      },
      py::arg("n"), R"doc(
The configuration documented as best for minimize() on a smooth function of n variables:
one particle holding the whole vector, softmax at temperature 0.5 on min-max scaled costs,
a trust region whose probe radius follows it, and the learned (BFGS) metric.)doc");
}

}  // namespace polyprobe::python
