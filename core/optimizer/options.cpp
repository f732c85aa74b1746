// The option table (optimizer_options.hpp): one row per OptimizerConfig or SubspaceSettings
// field a user may set, with its parser, printer and requirement.
#include <polyprobe/error.hpp>
#include <polyprobe/optimizer_options.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>

namespace polyprobe {

namespace {

// A field of the settings. The table's printers read through the same accessor as its
// parsers; they never write.
template <class T>
using Field = T& (*)(OptimizerSettings&);

template <class T>
const T& read(Field<T> field, const OptimizerSettings& settings) {
  return field(const_cast<OptimizerSettings&>(settings));  // NOLINT: read-only use
}

std::string format(double value) {
  std::array<char, 64> text{};
  const auto [end, ec] = std::to_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() ? std::string(text.data(), end) : std::to_string(value);
}

[[noreturn]] void malformed(const std::string& name, const std::string& expected,
                            std::string_view value) {
  throw Error("--" + name + ": expected " + expected + ", got '" + std::string(value) + "'");
}

double parse_number(const std::string& name, std::string_view value) {
  double x = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
  if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(x))
    malformed(name, "a finite number", value);
  return x;
}

template <class T>
T parse_integer(const std::string& name, std::string_view value) {
  T x = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
  if (ec == std::errc::result_out_of_range)
    malformed(name,
              "an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                  std::to_string(std::numeric_limits<T>::max()) + "]",
              value);
  if (ec != std::errc() || end != value.data() + value.size()) malformed(name, "an integer", value);
  return x;
}

bool parse_flag(const std::string& name, std::string_view value) {
  for (const char* yes : {"on", "true", "yes", "1"})
    if (value == yes) return true;
  for (const char* no : {"off", "false", "no", "0"})
    if (value == no) return false;
  malformed(name, "on or off (also true/false, yes/no, 1/0)", value);
}

struct Row {
  std::string name, group, help;
  std::vector<std::string> aliases = {};
  OptionScope scope = OptionScope::both;
};

OptimizerOption base(Row row, OptionType type) {
  OptimizerOption o;
  o.name = std::move(row.name);
  o.group = std::move(row.group);
  o.help = std::move(row.help);
  o.aliases = std::move(row.aliases);
  o.scope = row.scope;
  o.type = type;
  return o;
}

OptimizerOption number(Row row, Field<double> field) {
  OptimizerOption o = base(std::move(row), OptionType::number);
  o.set = [field, name = o.name](OptimizerSettings& s, std::string_view v) {
    field(s) = parse_number(name, v);
  };
  o.get = [field](const OptimizerSettings& s) { return format(read(field, s)); };
  return o;
}

template <class T>
OptimizerOption integer(Row row, Field<T> field) {
  OptimizerOption o = base(std::move(row), OptionType::integer);
  o.set = [field, name = o.name](OptimizerSettings& s, std::string_view v) {
    field(s) = parse_integer<T>(name, v);
  };
  o.get = [field](const OptimizerSettings& s) { return std::to_string(read(field, s)); };
  return o;
}

OptimizerOption flag(Row row, Field<bool> field) {
  OptimizerOption o = base(std::move(row), OptionType::flag);
  o.set = [field, name = o.name](OptimizerSettings& s, std::string_view v) {
    field(s) = parse_flag(name, v);
  };
  o.get = [field](const OptimizerSettings& s) {
    return std::string(read(field, s) ? "on" : "off");
  };
  return o;
}

// An enum choice, parsed and printed by the enum's own functions (whose error lists the
// accepted names).
template <class E>
OptimizerOption choice(Row row, Field<E> field, std::vector<std::string> choices,
                       E (*parse)(std::string_view), std::string_view (*print)(E)) {
  OptimizerOption o = base(std::move(row), OptionType::choice);
  o.choices = std::move(choices);
  o.set = [field, parse, name = o.name](OptimizerSettings& s, std::string_view v) {
    try {
      field(s) = parse(v);
    } catch (const Error& e) {
      throw Error("--" + name + ": " + e.what());
    }
  };
  o.get = [field, print](const OptimizerSettings& s) { return std::string(print(read(field, s))); };
  return o;
}

OptimizerOption& needs(OptimizerOption& o, std::string requirement,
                       std::function<bool(const OptimizerSettings&)> applies) {
  o.requirement = std::move(requirement);
  o.applies = std::move(applies);
  return o;
}

bool in_subspace(const OptimizerSettings& s) { return s.subspace.kind != "full"; }

bool offers(const std::vector<std::string>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The core's subspace kinds and the plugins', for messages.
std::string kind_names(const OptimizerSettings& s) {
  std::string names = subspace_kind_names();
  for (const std::string& k : s.plugin_subspace_kinds)
    if (find_subspace_kind(k) == nullptr) names += ", " + k;
  return names;
}
bool schedule_is(const OptimizerSettings& s, std::initializer_list<ScheduleKind> kinds) {
  return std::find(kinds.begin(), kinds.end(), s.optimizer.schedule) != kinds.end();
}
bool radius_is(const OptimizerSettings& s, std::initializer_list<RadiusModelKind> kinds) {
  return std::find(kinds.begin(), kinds.end(), s.optimizer.radius.kind) != kinds.end();
}

// The to_string overloads, one name per enum, so they convert to function pointers.
std::string_view print_polytope(PolytopeKind k) { return to_string(k); }
std::string_view print_metric(MetricKind k) { return to_string(k); }
std::string_view print_schedule(ScheduleKind k) { return to_string(k); }
std::string_view print_radius(RadiusModelKind k) { return to_string(k); }
std::string_view print_solver(TransportSolver k) { return to_string(k); }
std::string_view print_scaling(CostScaling k) { return to_string(k); }
std::string_view print_blocks(BlockStrategy k) { return to_string(k); }
RotationMethod parse_rotation(std::string_view name) {
  if (name == "automatic" || name == "auto") return RotationMethod::automatic;
  if (name == "qr") return RotationMethod::qr;
  if (name == "householder") return RotationMethod::householder;
  throw Error("unknown rotation method '" + std::string(name) +
              "' (use automatic, qr or householder)");
}
std::string_view print_rotation(RotationMethod k) {
  return k == RotationMethod::qr            ? "qr"
         : k == RotationMethod::householder ? "householder"
                                            : "automatic";
}

std::vector<OptimizerOption> make_table() {
  const std::string geometry = "particles and polytope";
  const std::string subspace = "subspace";
  const std::string radii = "radii and schedule";
  const std::string model = "radius model";
  const std::string transport = "transport";
  const std::string blocks = "blocks";
  const std::string momentum = "momentum";
  const std::string budget = "budget controls";
  using S = OptimizerSettings&;
  std::vector<OptimizerOption> t;

  // Subspace (training only: minimize() has no model to build one for).
  {
    OptimizerOption o = base({"subspace",
                              subspace,
                              "search a subspace of the parameters instead of all of them: full "
                              "(none), hybrid, or a plugin's kind such as factored (the plugin "
                              "factored_subspace; docs/training.md says when)",
                              {},
                              OptionScope::training},
                             OptionType::choice);
    for (const SubspaceKind& kind : subspace_kinds()) o.choices.push_back(kind.name);
    o.set = [](S s, std::string_view v) {
      if (find_subspace_kind(v) == nullptr && !offers(s.plugin_subspace_kinds, v))
        throw Error("--subspace: unknown subspace kind '" + std::string(v) +
                    "' (kinds: " + kind_names(s) + ")");
      s.subspace.kind = std::string(v);
    };
    o.get = [](const OptimizerSettings& s) { return s.subspace.kind; };
    t.push_back(std::move(o));
  }
  t.push_back(integer<int64_t>({"subspace-rank",
                                subspace,
                                "basis rank per weight matrix (hybrid: U and V, factored: B)",
                                {"rank"},
                                OptionScope::training},
                               [](S s) -> int64_t& { return s.subspace.rank; }));
  needs(t.back(), "--subspace hybrid or factored", in_subspace);
  t.push_back(integer<int64_t>(
      {"max-subspace-dim",
       subspace,
       "bound on the subspace's coordinates in all (0: none); hybrid shrinks every matrix's "
       "share proportionally, factored takes the largest rank that fits",
       {},
       OptionScope::training},
      [](S s) -> int64_t& { return s.subspace.max_subspace_dim; }));
  needs(t.back(), "--subspace hybrid or factored", in_subspace);
  t.push_back(integer<uint64_t>(
      {"subspace-seed", subspace, "seed of the subspace's bases", {}, OptionScope::training},
      [](S s) -> uint64_t& { return s.subspace.seed; }));
  needs(t.back(), "--subspace hybrid or factored", in_subspace);
  t.push_back(integer<int64_t>(
      {"subspace-rotation-interval",
       subspace,
       "redraw the subspace's bases before every N-th step (from --subspace-seed and step / N, "
       "so a resumed run redraws the same ones; momentum restarts), so that a small subspace "
       "reaches other directions over a run; 0: never",
       {},
       OptionScope::training},
      [](S s) -> int64_t& { return s.optimizer.subspace_rotation_interval; }));
  needs(t.back(), "--subspace hybrid or factored", in_subspace);

  // Particles and polytope.
  t.push_back(integer<int32_t>(
      {"particle-dim", geometry, "coordinates per particle in the full parameter space (d)", {"d"}},
      [](S s) -> int32_t& { return s.optimizer.particle_dim; }));
  needs(t.back(), "--subspace full (in a subspace set --subspace-particle-dim)",
        [](const OptimizerSettings& s) { return !in_subspace(s); });
  t.push_back(integer<int32_t>({"subspace-particle-dim",
                                geometry,
                                "coordinates per particle in a subspace",
                                {},
                                OptionScope::training},
                               [](S s) -> int32_t& { return s.optimizer.subspace_particle_dim; }));
  needs(t.back(), "--subspace hybrid or factored", in_subspace);
  t.push_back(choice<PolytopeKind>(
      {"polytope", geometry,
       "vertices per particle: simplex (d + 1), orthoplex (2 d, "
       "central differences) or cube (2^d)"},
      [](S s) -> PolytopeKind& { return s.optimizer.polytope; }, {"simplex", "orthoplex", "cube"},
      parse_polytope, print_polytope));
  t.push_back(integer<int32_t>({"num-probe",
                                geometry,
                                "probes per vertex (K): radii k / (K + 1) of the probe radius, "
                                "k = 1 .. K; the cost is the mean over them",
                                {"K", "probes"}},
                               [](S s) -> int32_t& { return s.optimizer.num_probe; }));
  t.push_back(choice<RotationMethod>(
      {"rotation", geometry,
       "how the random rotations are drawn: automatic, qr or householder (all exact Haar)"},
      [](S s) -> RotationMethod& { return s.optimizer.rotation; },
      {"automatic", "qr", "householder"}, parse_rotation, print_rotation));
  t.push_back(flag({"biased-rotation", geometry,
                    "point each particle's first polytope axis along its last move"},
                   [](S s) -> bool& { return s.optimizer.biased_rotation; }));
  t.push_back(choice<MetricKind>(
      {"metric", geometry,
       "polytope shape: identity, or bfgs (learned per particle from the quadratic model's "
       "gradients)"},
      [](S s) -> MetricKind& { return s.optimizer.metric; }, {"identity", "bfgs"}, parse_metric,
      print_metric));

  // Radii and schedule.
  t.push_back(
      number({"step-radius", radii, "how far a move may go, times epsilon(t): the learning rate"},
             [](S s) -> double& { return s.optimizer.step_radius; }));
  t.push_back(number(
      {"probe-radius", radii, "how far candidates probe from the incumbent, times epsilon(t)"},
      [](S s) -> double& { return s.optimizer.probe_radius; }));
  t.push_back(choice<ScheduleKind>(
      {"schedule", radii, "epsilon schedule: constant, linear, cosine, progressive or power"},
      [](S s) -> ScheduleKind& { return s.optimizer.schedule; },
      {"constant", "linear", "cosine", "progressive", "power"}, parse_schedule, print_schedule));
  t.push_back(number({"epsilon", radii,
                      "radius scale at the start (and the transport temperature unless "
                      "--ent-epsilon is set)"},
                     [](S s) -> double& { return s.optimizer.epsilon; }));
  t.push_back(number({"epsilon-final", radii, "epsilon at the end of the run"},
                     [](S s) -> double& { return s.optimizer.epsilon_final; }));
  needs(t.back(), "--schedule linear, cosine or progressive", [](const OptimizerSettings& s) {
    return schedule_is(s, {ScheduleKind::linear, ScheduleKind::cosine, ScheduleKind::progressive});
  });
  t.push_back(number({"schedule-decay-steps", radii, "power schedule's time scale in steps"},
                     [](S s) -> double& { return s.optimizer.schedule_decay_steps; }));
  needs(t.back(), "--schedule power",
        [](const OptimizerSettings& s) { return schedule_is(s, {ScheduleKind::power}); });
  t.push_back(number({"schedule-power", radii, "power schedule's exponent"},
                     [](S s) -> double& { return s.optimizer.schedule_power; }));
  needs(t.back(), "--schedule power",
        [](const OptimizerSettings& s) { return schedule_is(s, {ScheduleKind::power}); });
  t.push_back(number(
      {"schedule-decay-rate", radii, "progressive schedule's decay per converged solve, in (0, 1)"},
      [](S s) -> double& { return s.optimizer.schedule_decay_rate; }));
  needs(t.back(), "--schedule progressive",
        [](const OptimizerSettings& s) { return schedule_is(s, {ScheduleKind::progressive}); });

  // Radius model: the core's, or a plugin's by name (its factory is bound later, by the
  // registry).
  t.push_back(choice<RadiusModelKind>(
      {"radius-model",
       model,
       "fixed (the schedule alone), adaptive (grows the radius on stagnation), quadratic "
       "(finite-difference model picks the step length; one extra forward a step), "
       "trust_region (bench dfo and the manual step API only), or a plugin's radius model "
       "(`polyprobe plugins` lists them)",
       {"radius"}},
      [](S s) -> RadiusModelKind& { return s.optimizer.radius.kind; },
      {"fixed", "adaptive", "quadratic", "trust_region"}, parse_radius_model, print_radius));
  {
    OptimizerOption& o = t.back();
    o.set = [name = o.name](S s, std::string_view v) {
      RadiusModelSettings& r = s.optimizer.radius;
      if (!is_builtin_radius_model(v) && offers(s.plugin_radius_models, v)) {
        r.kind = RadiusModelKind::plugin;
        r.plugin_name = std::string(v);
        r.plugin_factory = nullptr;
        return;
      }
      try {
        r.kind = parse_radius_model(v);
      } catch (const Error& e) {
        throw Error("--" + name + ": " + e.what());
      }
    };
    o.get = [](const OptimizerSettings& s) {
      const RadiusModelSettings& r = s.optimizer.radius;
      return r.kind == RadiusModelKind::plugin ? r.plugin_name : std::string(to_string(r.kind));
    };
  }
  const auto adaptive = [](const OptimizerSettings& s) {
    return radius_is(s, {RadiusModelKind::adaptive});
  };
  const auto quadratic = [](const OptimizerSettings& s) {
    return radius_is(s, {RadiusModelKind::quadratic, RadiusModelKind::trust_region});
  };
  const auto trust = [](const OptimizerSettings& s) {
    return radius_is(s, {RadiusModelKind::trust_region});
  };
  t.push_back(number(
      {"stagnation-threshold", model, "relative change of the mean cost that counts as stagnation"},
      [](S s) -> double& { return s.optimizer.radius.stagnation_threshold; }));
  needs(t.back(), "--radius-model adaptive", adaptive);
  t.push_back(
      integer<int32_t>({"stagnation-patience", model, "stagnant steps before it grows"},
                       [](S s) -> int32_t& { return s.optimizer.radius.stagnation_patience; }));
  needs(t.back(), "--radius-model adaptive", adaptive);
  t.push_back(number({"radius-increase", model, "growth factor on stagnation (>= 1)"},
                     [](S s) -> double& { return s.optimizer.radius.radius_increase; }));
  needs(t.back(), "--radius-model adaptive", adaptive);
  t.push_back(number({"radius-decrease", model, "shrink factor on progress, in (0, 1]"},
                     [](S s) -> double& { return s.optimizer.radius.radius_decrease; }));
  needs(t.back(), "--radius-model adaptive", adaptive);
  t.push_back(number({"radius-min", model, "lower bound of the multiplier (<= 1)"},
                     [](S s) -> double& { return s.optimizer.radius.radius_min; }));
  needs(t.back(), "--radius-model adaptive", adaptive);
  t.push_back(number({"radius-max", model, "upper bound of the multiplier (>= 1)"},
                     [](S s) -> double& { return s.optimizer.radius.radius_max; }));
  needs(t.back(), "--radius-model adaptive", adaptive);
  t.push_back(number(
      {"quadratic-max-scale", model, "longest step of the quadratic model, in transport moves"},
      [](S s) -> double& { return s.optimizer.radius.quadratic_max_scale; }));
  needs(t.back(), "--radius-model quadratic or trust_region", quadratic);
  const std::pair<const char*, double RadiusModelSettings::*> trust_numbers[] = {
      {"trust-shrink-below", &RadiusModelSettings::trust_shrink_below},
      {"trust-grow-above", &RadiusModelSettings::trust_grow_above},
      {"trust-shrink", &RadiusModelSettings::trust_shrink},
      {"trust-grow", &RadiusModelSettings::trust_grow},
      {"trust-min", &RadiusModelSettings::trust_min},
      {"trust-max", &RadiusModelSettings::trust_max}};
  for (const auto& [name, member] : trust_numbers) {
    OptimizerOption o = base({name,
                              model,
                              "trust region (include/polyprobe/radius_model.hpp documents it)",
                              {},
                              OptionScope::minimize},
                             OptionType::number);
    o.set = [member = member, name = o.name](S s, std::string_view v) {
      s.optimizer.radius.*member = parse_number(name, v);
    };
    o.get = [member = member](const OptimizerSettings& s) {
      return format(s.optimizer.radius.*member);
    };
    t.push_back(std::move(o));
    needs(t.back(), "--radius-model trust_region", trust);
  }
  t.push_back(flag({"trust-scales-probe",
                    model,
                    "the probe radius follows the trust radius too",
                    {},
                    OptionScope::minimize},
                   [](S s) -> bool& { return s.optimizer.radius.trust_scales_probe; }));
  needs(t.back(), "--radius-model trust_region", trust);
  t.push_back(flag({"trust-reject",
                    model,
                    "undo a step that did not lower the objective",
                    {},
                    OptionScope::minimize},
                   [](S s) -> bool& { return s.optimizer.radius.trust_reject; }));
  needs(t.back(), "--radius-model trust_region", trust);

  // Transport.
  t.push_back(choice<TransportSolver>(
      {"solver", transport,
       "auto (sinkhorn in full space, softmax in a subspace), sinkhorn, softmax, greedy (all on "
       "the cheapest vertex) or top_k"},
      [](S s) -> TransportSolver& { return s.optimizer.solver; },
      {"auto", "sinkhorn", "softmax", "greedy", "top_k"}, parse_transport_solver, print_solver));
  t.push_back(number(
      {"ent-epsilon", transport, "transport temperature independent of the radii (0: epsilon(t))"},
      [](S s) -> double& { return s.optimizer.ent_epsilon; }));
  const auto sinkhorn = [](const OptimizerSettings& s) {
    return s.optimizer.solver == TransportSolver::sinkhorn ||
           (s.optimizer.solver == TransportSolver::automatic && !in_subspace(s));
  };
  t.push_back(
      integer<int32_t>({"sinkhorn-max-iterations", transport, "Sinkhorn iteration cap"},
                       [](S s) -> int32_t& { return s.optimizer.sinkhorn_max_iterations; }));
  needs(t.back(), "--solver sinkhorn (or auto in full space)", sinkhorn);
  t.push_back(number({"sinkhorn-tolerance", transport, "Sinkhorn marginal tolerance"},
                     [](S s) -> double& { return s.optimizer.sinkhorn_tolerance; }));
  needs(t.back(), "--solver sinkhorn (or auto in full space)", sinkhorn);
  t.push_back(integer<int32_t>({"top-k", transport, "vertices the top_k rule weighs equally"},
                               [](S s) -> int32_t& { return s.optimizer.top_k; }));
  needs(t.back(), "--solver top_k",
        [](const OptimizerSettings& s) { return s.optimizer.solver == TransportSolver::top_k; });
  t.push_back(choice<CostScaling>(
      {"cost-scaling", transport, "cost matrix rescaling: none, mean, max_cost or min_max"},
      [](S s) -> CostScaling& { return s.optimizer.cost_scaling; },
      {"none", "mean", "max_cost", "min_max"}, parse_cost_scaling, print_scaling));
  t.push_back(number({"nonfinite-margin", transport,
                      "a non-finite cost becomes the block's largest finite cost plus this "
                      "margin (times 1 + |max|)"},
                     [](S s) -> double& { return s.optimizer.nonfinite_margin; }));
  t.push_back(flag({"device-transport", transport,
                    "let a backend that offers it (cuda) solve the cost matrix, transport and "
                    "move where the losses are; off: on the host (same formulas)"},
                   [](S s) -> bool& { return s.optimizer.device_transport; }));
  t.push_back(flag({"device-rotations", transport,
                    "with the transport on the device: let a backend that offers it (cuda, "
                    "particles of d = 2) draw each step's rotations itself, the host's bits, so "
                    "nothing per particle is sent; off: the host draws and sends them"},
                   [](S s) -> bool& { return s.optimizer.device_rotations; }));
  needs(t.back(), "--device-transport on",
        [](const OptimizerSettings& s) { return s.optimizer.device_transport; });
  t.push_back(flag({"sharded-finish", transport,
                    "under mpirun, each rank computes the cost rows, transport and move of its "
                    "own particles only, exchanging partial sums and moves instead of every "
                    "loss; off: every rank gathers all losses and finishes the whole step "
                    "(the same bits)"},
                   [](S s) -> bool& { return s.optimizer.sharded_finish; }));

  // Blocks.
  t.push_back(choice<BlockStrategy>(
      {"blocks", blocks,
       "transport problems: monolithic (one for all particles), per_layer or grouped; same "
       "number of forwards"},
      [](S s) -> BlockStrategy& { return s.optimizer.blocks; },
      {"monolithic", "per_layer", "grouped"}, parse_block_strategy, print_blocks));
  t.push_back(integer<int32_t>(
      {"block-group-size", blocks, "parameter tensors per block of --blocks grouped"},
      [](S s) -> int32_t& { return s.optimizer.block_group_size; }));
  needs(t.back(), "--blocks grouped",
        [](const OptimizerSettings& s) { return s.optimizer.blocks == BlockStrategy::grouped; });

  // Momentum.
  const auto with_momentum = [](const OptimizerSettings& s) { return s.optimizer.momentum; };
  t.push_back(flag({"momentum", momentum,
                    "heavy-ball momentum on the moves (coefficient from --momentum-init to "
                    "--momentum-final over the run)"},
                   [](S s) -> bool& { return s.optimizer.momentum; }));
  t.push_back(number({"momentum-init", momentum, "momentum coefficient at the start, in [0, 1)"},
                     [](S s) -> double& { return s.optimizer.momentum_init; }));
  needs(t.back(), "--momentum", with_momentum);
  t.push_back(number({"momentum-final", momentum, "momentum coefficient at the end, in [0, 1)"},
                     [](S s) -> double& { return s.optimizer.momentum_final; }));
  needs(t.back(), "--momentum", with_momentum);
  t.push_back(number({"velocity-lr", momentum, "weight of each move in the velocity"},
                     [](S s) -> double& { return s.optimizer.velocity_lr; }));
  needs(t.back(), "--momentum", with_momentum);

  // Budget controls.
  t.push_back(flag({"adaptive-probes", budget,
                    "reuse the cost rows of stagnant particles while the objective is unchanged "
                    "(not with the quadratic radius model)"},
                   [](S s) -> bool& { return s.optimizer.adaptive_probes; }));
  t.push_back(number({"adaptive-probes-threshold", budget,
                      "squared move norm below which a particle counts as stagnant"},
                     [](S s) -> double& { return s.optimizer.adaptive_probes_threshold; }));
  needs(t.back(), "--adaptive-probes",
        [](const OptimizerSettings& s) { return s.optimizer.adaptive_probes; });
  t.push_back(integer<int32_t>({"amortize-steps", budget,
                                "k: k - 1 momentum-only steps (no evaluation) between scored "
                                "steps; 1 = every step scored"},
                               [](S s) -> int32_t& { return s.optimizer.amortize_steps; }));
  t.push_back(number(
      {"amortize-ema", budget, "decay of the velocity a momentum-only step applies, in [0, 1]"},
      [](S s) -> double& { return s.optimizer.amortize_ema; }));
  needs(t.back(), "--amortize-steps 2 or more",
        [](const OptimizerSettings& s) { return s.optimizer.amortize_steps > 1; });
  const auto screen = [](const OptimizerSettings& s) { return s.optimizer.multifidelity_screen; };
  t.push_back(flag({"multifidelity-screen", budget,
                    "rank candidates on part of the batch first and score only the best on all "
                    "of it (not with the quadratic radius model)"},
                   [](S s) -> bool& { return s.optimizer.multifidelity_screen; }));
  t.push_back(number({"screen-fidelity", budget, "share of the batch the screen scores on"},
                     [](S s) -> double& { return s.optimizer.screen_fidelity; }));
  needs(t.back(), "--multifidelity-screen", screen);
  t.push_back(number(
      {"screen-keep-ratio", budget, "share of the vertices the screen promotes to the full batch"},
      [](S s) -> double& { return s.optimizer.screen_keep_ratio; }));
  needs(t.back(), "--multifidelity-screen", screen);

  // minimize() only: its seed (train has its own --seed for everything).
  t.push_back(integer<uint64_t>({"seed", "minimize", "optimizer seed", {}, OptionScope::minimize},
                                [](S s) -> uint64_t& { return s.optimizer.seed; }));
  return t;
}

std::string canonical(std::string_view key) {
  std::string k(key);
  std::replace(k.begin(), k.end(), '_', '-');
  return k;
}

bool in_scope(const OptimizerOption& o, OptionScope scope) {
  return o.scope == OptionScope::both || o.scope == scope;
}

}  // namespace

const std::vector<OptimizerOption>& optimizer_options() {
  static const std::vector<OptimizerOption> table = make_table();
  return table;
}

const OptimizerOption* find_option(std::string_view key) {
  const std::string k = canonical(key);
  for (const OptimizerOption& o : optimizer_options()) {
    if (o.name == k) return &o;
    for (const std::string& alias : o.aliases)
      if (canonical(alias) == k) return &o;
  }
  return nullptr;
}

void set_option(OptimizerSettings& settings, std::string_view key, std::string_view value) {
  const OptimizerOption* o = find_option(key);
  if (o == nullptr)
    throw Error("unknown optimizer option '" + std::string(key) +
                "' (docs/training.md lists the optimizer options)");
  o->set(settings, value);
  settings.given.insert(o->name);
}

void validate_settings(const OptimizerSettings& settings, OptionScope scope) {
  for (const std::string& name : settings.given) {
    const OptimizerOption* o = find_option(name);
    if (o == nullptr) continue;
    if (!in_scope(*o, scope))
      throw Error("--" + o->name + " applies to " +
                  (o->scope == OptionScope::minimize ? "minimize() and bench dfo only"
                                                     : "polyprobe train only") +
                  (o->name.starts_with("trust") ? " (train() refuses the trust region)" : ""));
    if (o->applies && !o->applies(settings))
      throw Error("--" + o->name + " has no effect here: it applies with " + o->requirement +
                  " (drop it or set that)");
  }
  if (scope == OptionScope::training) {
    const SubspaceSettings& sub = settings.subspace;
    if (find_subspace_kind(sub.kind) == nullptr &&
        !offers(settings.plugin_subspace_kinds, sub.kind))
      throw Error("--subspace: unknown subspace kind '" + sub.kind +
                  "' (kinds: " + kind_names(settings) + ")");
    if (sub.kind != "full" && sub.rank < 1)
      throw Error("--subspace-rank must be at least 1, got " + std::to_string(sub.rank));
    if (sub.max_subspace_dim < 0)
      throw Error("--max-subspace-dim must be >= 0 (0: no bound), got " +
                  std::to_string(sub.max_subspace_dim));
    if (settings.optimizer.radius.kind == RadiusModelKind::trust_region)
      throw Error(
          "--radius-model trust_region needs one fixed objective, and minibatches change it "
          "every step; use fixed, adaptive or quadratic here, or the library's manual step API");
  }
  settings.optimizer.validate();
}

OptimizerSettings training_defaults() {
  OptimizerSettings s;
  OptimizerConfig& c = s.optimizer;
  c.particle_dim = 2;
  c.step_radius = 2.0;
  c.probe_radius = 2.0;
  c.epsilon = 0.3;
  c.epsilon_final = 0.02;
  c.schedule = ScheduleKind::cosine;
  c.radius.kind = RadiusModelKind::quadratic;
  c.polytope = PolytopeKind::simplex;
  return s;
}

}  // namespace polyprobe
