// Plugin discovery, loading and selection (see registry.hpp for the rules).
#define BOOST_DLL_USE_STD_FS
#include <polyprobe/accumulator.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/geometry.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/plugin/plugin.hpp>
#include <polyprobe/radius_model.hpp>
#include <polyprobe/registry.hpp>

#include "plugin/plugin_impl.hpp"

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <span>
#include <sstream>

#ifndef POLYPROBE_PLUGIN_RELDIR
#define POLYPROBE_PLUGIN_RELDIR "../lib/polyprobe/plugins"
#endif

namespace polyprobe {
namespace fs = std::filesystem;

namespace {

// Loaded libraries are never unloaded (docs/design.md section 4): their threads, static state
// and the function pointers we keep must outlive every caller. The handles are parked in
// a container that is itself never destroyed.
std::vector<boost::dll::shared_library*>& parked_libraries() {
  static auto* libraries = new std::vector<boost::dll::shared_library*>();
  return *libraries;
}

bool is_plugin_file(const fs::path& path) {
  const std::string name = path.filename().string();
  return name.starts_with("libpolyprobe_") && path.extension() == ".so";
}

// The smallest descriptor of this API (through accumulator_create): the fields after it are
// read only when struct_size covers them.
constexpr uint32_t kPluginMinSize =
    static_cast<uint32_t>(offsetof(pp_plugin, accumulator_create) + sizeof(void*));

bool valid_name(const char* name) {
  if (name == nullptr || *name == '\0' || std::strlen(name) > 64) return false;
  return std::all_of(name, name + std::strlen(name), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

std::string safe(const char* text) { return text == nullptr ? std::string() : std::string(text); }

// The refusal of a plugin built for another API version.
std::string wrong_api(uint32_t version) {
  return "it was built against plugin API " + std::to_string(version) + "; this polyprobe is API " +
         std::to_string(PP_PLUGIN_API_VERSION) + ": rebuild it against the installed package";
}

// The subspace kinds of a descriptor (none when it predates them).
std::span<const pp_subspace_kind> subspace_kinds_of(const pp_plugin* desc) {
  if (desc == nullptr || !PP_HAS_FIELD(desc, pp_plugin, n_subspaces) || desc->n_subspaces <= 0 ||
      desc->subspaces == nullptr)
    return {};
  return {desc->subspaces, static_cast<std::size_t>(desc->n_subspaces)};
}

// The radius models of a descriptor (none when it predates them).
std::span<const pp_radius_model_kind> radius_models_of(const pp_plugin* desc) {
  if (desc == nullptr || !PP_HAS_FIELD(desc, pp_plugin, n_radius_models) ||
      desc->n_radius_models <= 0 || desc->radius_models == nullptr)
    return {};
  return {desc->radius_models, static_cast<std::size_t>(desc->n_radius_models)};
}

// Why a subspace kind or radius model entry cannot be used; empty when it can.
std::string incomplete_component(const pp_subspace_kind& k) {
  if (k.struct_size < sizeof(pp_subspace_kind)) return "its struct_size is too small";
  if (!valid_name(k.kind)) return "it has no valid name";
  if (k.create == nullptr || k.destroy == nullptr || k.describe == nullptr)
    return "it lacks create, destroy or describe";
  return {};
}
std::string incomplete_component(const pp_radius_model_kind& k) {
  if (k.struct_size < sizeof(pp_radius_model_kind)) return "its struct_size is too small";
  if (!valid_name(k.name)) return "it has no valid name";
  if (k.create == nullptr || k.destroy == nullptr || k.multipliers == nullptr ||
      k.save == nullptr || k.load == nullptr)
    return "it lacks create, destroy, multipliers, save or load";
  return {};
}

// Why `path` cannot be a shared library, judged from its first bytes before dlopen sees it
// (dlopen's own words for these cases are poor: "file too short" for any short text file);
// empty when it looks like one.
std::string not_elf_reason(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return "cannot read the file";
  std::array<char, 64> head{};
  file.read(head.data(), head.size());
  const std::streamsize n = file.gcount();
  if (n < 4 || std::memcmp(head.data(),
                           "\x7f"
                           "ELF",
                           4) != 0)
    return "not a shared library (invalid ELF header)";
  if (n < 52) return "not a shared library (truncated ELF header)";  // ELF32's header size
  return {};
}

// dlopen's reason out of Boost.DLL's exception text, which wraps it as "...load() failed
// (dlerror system message: PATH: REASON): Bad file descriptor" (the errno part is
// Boost's placeholder, not the cause).
std::string load_failure(const std::string& what, const fs::path& path) {
  const std::string marker = "dlerror system message: ";
  const std::size_t at = what.find(marker);
  if (at == std::string::npos) return what;
  const std::size_t end = what.rfind(')');
  std::string reason = what.substr(at + marker.size(), end == std::string::npos || end < at
                                                           ? std::string::npos
                                                           : end - at - marker.size());
  const std::string prefix = path.string() + ": ";
  if (reason.starts_with(prefix)) reason.erase(0, prefix.size());
  return reason;
}

}  // namespace

PluginRegistry::PluginRegistry() : operations_(std::make_shared<OperationTable>()) {}
PluginRegistry::~PluginRegistry() = default;

fs::path PluginRegistry::executable_plugin_dir() {
  std::error_code ec;
  const fs::path exe = boost::dll::program_location(ec);
  if (ec || exe.empty()) return {};
  return (exe.parent_path() / POLYPROBE_PLUGIN_RELDIR).lexically_normal();
}

std::vector<fs::path> PluginRegistry::search_path(const std::vector<fs::path>& explicit_dirs,
                                                  std::vector<std::string>* warnings) {
  std::vector<fs::path> dirs(explicit_dirs.begin(), explicit_dirs.end());
  if (const char* env = std::getenv("POLYPROBE_PLUGIN_PATH"); env != nullptr) {
    std::stringstream entries(env);
    std::string entry;
    // An empty entry would mean the current directory in PATH-like variables, and a relative
    // one a folder of wherever polyprobe runs: plugins are never loaded from there.
    while (std::getline(entries, entry, ':')) {
      if (entry.empty()) continue;
      if (fs::path(entry).is_relative()) {
        if (warnings != nullptr)
          warnings->push_back("POLYPROBE_PLUGIN_PATH entry '" + entry +
                              "' is a relative path (it would depend on the working folder); "
                              "ignored: give absolute paths");
        continue;
      }
      dirs.emplace_back(entry);
    }
  }
  if (fs::path own = executable_plugin_dir(); !own.empty()) dirs.push_back(own);
  return dirs;
}

void PluginRegistry::load_directories(const std::vector<fs::path>& dirs) {
  for (const fs::path& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (is_plugin_file(entry.path())) files.push_back(entry.path());
    // Any user could put code there that this process runs.
    const auto writable_by_all = [](const fs::path& p) {
      std::error_code error;
      const fs::perms perms = fs::status(p, error).permissions();
      return !error && (perms & fs::perms::others_write) != fs::perms::none;
    };
    if (!files.empty() && writable_by_all(dir))
      warnings_.push_back("plugin folder '" + dir.string() +
                          "' is writable by every user: anyone can place code in it that "
                          "polyprobe loads (remove write permission for others: chmod o-w)");
    for (const fs::path& file : files)
      if (writable_by_all(file))
        warnings_.push_back("plugin '" + file.string() +
                            "' is writable by every user: anyone can change the code polyprobe "
                            "loads (chmod o-w)");
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) load_library(file);
  }
}

const PluginInfo* PluginRegistry::find(const std::string& name) const {
  for (std::size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].loaded && infos_[i].name == name) return &infos_[i];
  return nullptr;
}

void PluginRegistry::load_library(const fs::path& requested) {
  std::error_code ec;
  fs::path path = fs::weakly_canonical(requested, ec);
  if (ec) path = requested;
  for (const PluginInfo& info : infos_)
    if (info.path == path) return;  // the same file reached through two search entries

  PluginInfo info;
  info.path = path;
  info.name = path.stem().string();
  const pp_plugin* desc = nullptr;
  auto record = [&](std::string reason) {
    info.reason = std::move(reason);
    infos_.push_back(std::move(info));
    descriptors_.push_back(desc);
  };

  if (std::string why = not_elf_reason(path); !why.empty()) return record(why);
  auto* library = new boost::dll::shared_library();
  try {
    library->load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    delete library;
    return record("cannot load the library: " + load_failure(e.what(), path));
  }
  parked_libraries().push_back(library);  // never unloaded, even when rejected below

  if (!library->has(PP_ENTRY_SYMBOL))
    return record(std::string("not a polyprobe plugin: it does not export ") + PP_ENTRY_SYMBOL);
  auto entry = library->get<const pp_plugin*(uint32_t)>(PP_ENTRY_SYMBOL);
  try {
    desc = entry(PP_PLUGIN_API_VERSION);
  } catch (const std::exception& e) {
    return record(std::string("its entry function threw: ") + e.what());
  } catch (...) {
    return record("its entry function threw an unknown exception");
  }
  if (desc == nullptr) {
    // A plugin answers only the version it was built for: ask the older ones, to name it.
    // Only api_version, the first field of every version's descriptor, is read.
    for (uint32_t older = PP_PLUGIN_API_VERSION - 1; older >= 1; --older) {
      const pp_plugin* old = nullptr;
      try {
        old = entry(older);
      } catch (...) {
        break;
      }
      if (old != nullptr && old->api_version == older) {
        info.abi = older;
        return record(wrong_api(older));
      }
    }
    return record("it declined this host's plugin API version " +
                  std::to_string(PP_PLUGIN_API_VERSION) +
                  ": rebuild it against the installed package");
  }
  info.abi = desc->api_version;
  if (desc->api_version != PP_PLUGIN_API_VERSION) {
    const std::string reason = wrong_api(desc->api_version);
    desc = nullptr;
    return record(reason);
  }
  if (desc->struct_size < kPluginMinSize) {
    const std::string reason =
        "its descriptor is too small (struct_size " + std::to_string(desc->struct_size) + " < " +
        std::to_string(kPluginMinSize) + "): rebuild it against this polyprobe";
    desc = nullptr;
    return record(reason);
  }
  if (!valid_name(desc->name)) {
    desc = nullptr;
    return record("its descriptor has no valid name (letters, digits, '_', '-', '.'; at most 64)");
  }
  info.name = desc->name;
  info.version = safe(desc->version);
  info.vendor = safe(desc->vendor);
  info.summary = safe(desc->summary);
  info.loaded = true;
  if (const PluginInfo* other = find(info.name); other != nullptr) {
    const std::string reason = "duplicate: a plugin named '" + info.name +
                               "' is already loaded from " + other->path.string();
    // This file stays unloaded (often the shipped plugin, last on the search path): whatever
    // it offered now comes from the other file, or from a slower fallback when that one does
    // not offer it.
    warnings_.push_back("plugin '" + info.name + "' from " + other->path.string() +
                        " shadows the plugin of that name at " + path.string() +
                        ", which is not loaded: what that one offers may fall back to slower "
                        "backends (the core's reference evaluator); remove the first from the "
                        "plugin path to use the second");
    info.loaded = false;
    desc = nullptr;
    return record(reason);
  }
  if (desc->n_caps < 0 || (desc->n_caps > 0 && desc->caps == nullptr) || desc->n_layers < 0 ||
      (desc->n_layers > 0 && desc->layers == nullptr)) {
    info.loaded = false;
    desc = nullptr;
    return record("its descriptor lists capabilities or layers without data");
  }
  for (int32_t i = 0; i < desc->n_caps; ++i) {
    const pp_capability& cap = desc->caps[i];
    std::string device = device_name_of(cap.device, cap.device_name);
    if (device.empty()) {
      info.loaded = false;
      const std::string reason =
          "its capability #" + std::to_string(i) + " (" + safe(cap.name).substr(0, 64) +
          ") has no valid device (type " + device_type_label(cap.device) + ", name '" +
          (cap.device_name == nullptr ? std::string("NULL") : safe(cap.device_name).substr(0, 40)) +
          "'): a name of lower case letters, digits, '_' and '-', at most 32, and \"cpu\" "
          "exactly with PP_DEVICE_TYPE_CPU";
      desc = nullptr;
      return record(reason);
    }
    CapabilityInfo c{detail::component_label(cap.component),
                     safe(cap.name),
                     std::move(device),
                     device_type_label(cap.device),
                     {},
                     safe(cap.summary),
                     {}};
    for (int32_t t = PP_DTYPE_F32; t <= PP_DTYPE_F16; ++t)
      if ((cap.dtypes & PP_DTYPE_BIT(t)) != 0) c.dtypes.push_back(detail::dtype_label(t));
    if (cap.component == PP_COMPONENT_EVALUATOR) {
      if ((cap.flags & PP_EVALUATOR_AUTOCAST_BF16) != 0) c.candidate_dtypes.emplace_back("bf16");
      if ((cap.flags & PP_EVALUATOR_AUTOCAST_F16) != 0) c.candidate_dtypes.emplace_back("fp16");
    }
    info.capabilities.push_back(std::move(c));
  }
  for (int32_t i = 0; i < desc->n_layers; ++i) {
    const pp_layer_kind& kind = desc->layers[i];
    if (kind.struct_size < sizeof(pp_layer_kind) || !valid_name(kind.kind) ||
        kind.create == nullptr || kind.destroy == nullptr || kind.describe == nullptr ||
        kind.forward == nullptr) {
      info.loaded = false;
      desc = nullptr;
      return record("its layer kind #" + std::to_string(i) + " is incomplete");
    }
    // A plugin may also declare its layer kinds as PP_COMPONENT_LAYER capabilities: one
    // entry per kind, the declared one, completed from the layer kind.
    auto declared = std::find_if(
        info.capabilities.begin(), info.capabilities.end(),
        [&](const CapabilityInfo& c) { return c.component == "layer" && c.name == kind.kind; });
    if (declared != info.capabilities.end()) {
      if (declared->summary.empty()) declared->summary = safe(kind.summary);
      if (declared->dtypes.empty()) declared->dtypes = {"float32", "float64"};
      continue;
    }
    info.capabilities.push_back(
        {"layer", kind.kind, "cpu", "cpu", {"float32", "float64"}, safe(kind.summary), {}});
  }
  // Subspace kinds and radius models: listed like layers, their declared capability (if
  // any) completed rather than repeated.
  const auto list = [&](const char* component, const char* name, const char* summary) {
    auto declared = std::find_if(
        info.capabilities.begin(), info.capabilities.end(),
        [&](const CapabilityInfo& c) { return c.component == component && c.name == name; });
    if (declared == info.capabilities.end())
      info.capabilities.push_back({component, name, "cpu", "cpu", {}, safe(summary), {}});
    else if (declared->summary.empty())
      declared->summary = safe(summary);
  };
  if (PP_HAS_FIELD(desc, pp_plugin, n_radius_models) &&
      (desc->n_subspaces < 0 || (desc->n_subspaces > 0 && desc->subspaces == nullptr) ||
       desc->n_radius_models < 0 ||
       (desc->n_radius_models > 0 && desc->radius_models == nullptr))) {
    info.loaded = false;
    desc = nullptr;
    return record("its descriptor lists subspace kinds or radius models without data");
  }
  for (std::size_t i = 0; i < subspace_kinds_of(desc).size(); ++i) {
    const pp_subspace_kind& kind = subspace_kinds_of(desc)[i];
    if (const std::string why = incomplete_component(kind); !why.empty()) {
      info.loaded = false;
      desc = nullptr;
      return record("its subspace kind #" + std::to_string(i) + " is incomplete: " + why);
    }
    list("subspace", kind.kind, kind.summary);
  }
  for (std::size_t i = 0; i < radius_models_of(desc).size(); ++i) {
    const pp_radius_model_kind& model = radius_models_of(desc)[i];
    if (const std::string why = incomplete_component(model); !why.empty()) {
      info.loaded = false;
      desc = nullptr;
      return record("its radius model #" + std::to_string(i) + " is incomplete: " + why);
    }
    list("radius_model", model.name, model.summary);
  }
  if (desc->probe == nullptr) {
    info.score = 1;
  } else {
    pp_error why{};
    try {
      info.score = desc->probe(&why);
    } catch (...) {
      info.score = 0;
      std::snprintf(why.message, sizeof(why.message), "its probe threw");
    }
    if (info.score <= 0) {
      info.score = 0;
      return record("unusable on this machine: " + detail::error_text(why));
    }
  }
  info.available = true;
  std::string notes;
  if (PP_HAS_FIELD(desc, pp_plugin, n_operations) && desc->n_operations > 0 &&
      desc->operations != nullptr)
    for (int32_t i = 0; i < desc->n_operations; ++i) {
      const pp_operation& op = desc->operations[i];
      std::string why = op.name != nullptr && std::find(withheld_.begin(), withheld_.end(),
                                                        op.name) != withheld_.end()
                            ? "withheld by the host (--no-operation, polyprobe.withhold_operations)"
                            : operations_->add(&op, info.name);
      if (!why.empty())
        notes += std::string(notes.empty() ? "" : "; ") + "operation " + safe(op.name) + " (" +
                 (op.device_name == nullptr ? "cpu" : safe(op.device_name).substr(0, 40)) +
                 ") not offered: " + why;
    }
  record(notes);
}

std::vector<std::string> PluginRegistry::offered_operations() const {
  std::vector<std::string> names;
  for (const pp_plugin* desc : descriptors_)
    if (desc != nullptr && PP_HAS_FIELD(desc, pp_plugin, n_operations) && desc->operations)
      for (int32_t i = 0; i < desc->n_operations; ++i)
        if (desc->operations[i].name != nullptr) names.emplace_back(desc->operations[i].name);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

void PluginRegistry::register_layers(LayerFactory& factory) {
  for (const OperationTable::Entry& e : operations_->entries())
    (void)factory.operations()->add(e.op, e.provider);  // probed already: cannot fail now
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    PluginInfo& info = infos_[i];
    const pp_plugin* desc = descriptors_[i];
    if (!info.available || desc == nullptr) continue;
    for (int32_t k = 0; k < desc->n_layers; ++k) {
      const pp_layer_kind* kind = &desc->layers[k];
      if (factory.contains(kind->kind)) {
        info.reason += std::string(info.reason.empty() ? "" : "; ") + "layer kind '" + kind->kind +
                       "' skipped: already provided by " + factory.kinds().at(kind->kind).provider;
        continue;
      }
      factory.add(kind->kind,
                  {[kind, name = info.name](const nlohmann::json& attrs, const Shape& in) {
                     return detail::make_plugin_layer(kind, name, attrs, in);
                   },
                   safe(kind->summary), info.name});
    }
  }
}

nlohmann::json Selection::to_json() const {
  return {{"component", component}, {"chosen", chosen}, {"reasons", reasons}};
}

std::unique_ptr<Evaluator> PluginRegistry::make_evaluator(const Model& model, const Loss& loss,
                                                          const EvaluatorRequest& request,
                                                          Selection* selection) const {
  Selection local;
  Selection& sel = selection != nullptr ? *selection : local;
  sel = Selection{"evaluator", "", {}};
  const std::string& backend = request.backend;
  const bool automatic = backend.empty() || backend == "auto";
  const std::vector<std::string> devices = device_names();
  if (std::find(devices.begin(), devices.end(), request.device) == devices.end()) {
    std::string known, not_loaded;
    for (const std::string& d : devices) known += (known.empty() ? "" : ", ") + d;
    for (const PluginInfo& info : infos_)
      if (!info.loaded) not_loaded += (not_loaded.empty() ? "" : ", ") + info.path.string();
    throw Error("unknown device '" + request.device + "' (known: " + known +
                "): a device other than cpu is known when a loaded plugin declares it; load "
                "the plugin for it with --plugin-dir DIR or POLYPROBE_PLUGIN_PATH" +
                (not_loaded.empty() ? std::string() : " (these did not load: " + not_loaded + ")") +
                "; `polyprobe plugins` lists what was found and why");
  }

  if (backend == "reference") {
    if (request.device != "cpu")
      throw Error("the reference evaluator runs on the cpu, not on " + request.device);
    sel.chosen = "reference";
    sel.reasons.emplace_back("reference: requested with --backend reference");
    return make_reference_evaluator(model, loss, request.subspace, request.options);
  }
  if (!automatic && find(backend) == nullptr) {
    // A library of that name that did not load (wrong API, no entry, ...): its reason.
    for (const PluginInfo& info : infos_)
      if (!info.loaded && (info.name == backend || info.name == "libpolyprobe_" + backend))
        throw Error("backend '" + backend + "' (" + info.path.string() +
                    ") is not loaded: " + info.reason);
    std::string known = "reference";
    for (const PluginInfo& info : infos_)
      if (info.loaded) known += ", " + info.name;
    throw Error("unknown backend '" + backend + "' (known: " + known +
                "); `polyprobe plugins` lists what was found and why");
  }

  const detail::ModelView view(model);
  const detail::LossView loss_view(loss);
  const detail::SubspaceView subspace_view(request.subspace);
  const int32_t dtype = detail::to_pp_dtype(request.options.dtype);
  const CandidateDType autocast = request.options.candidate_dtype;
  uint32_t autocast_flag = 0;  // the capability flag a plugin must declare to be sent it
  if (autocast == CandidateDType::bf16) autocast_flag = PP_EVALUATOR_AUTOCAST_BF16;
  if (autocast == CandidateDType::fp16) autocast_flag = PP_EVALUATOR_AUTOCAST_F16;
  const std::string autocast_name(to_string(autocast));

  struct Candidate {
    int score;
    std::string name;
    const pp_plugin* desc;
    detail::DeviceRef device;  // as the plugin declares the requested device
  };
  std::vector<Candidate> candidates;
  std::string explicit_reason;
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    const PluginInfo& info = infos_[i];
    const pp_plugin* desc = descriptors_[i];
    if (!info.loaded) continue;
    auto decline = [&](const std::string& why) {
      sel.reasons.push_back(info.name + ": declined: " + why);
      if (info.name == backend) explicit_reason = why;
    };
    if (!info.available) {
      decline(info.reason);
      continue;
    }
    if (request.subspace != nullptr && subspace_view.get() == nullptr) {
      decline(subspace_view.reason());
      continue;
    }
    if (desc->session_create == nullptr) {
      if (info.name == backend) decline("it provides no evaluator");
      continue;
    }
    bool device_ok = false, dtype_ok = false, autocast_ok = autocast_flag == 0;
    detail::DeviceRef device{PP_DEVICE_TYPE_CPU, request.device};
    for (int32_t c = 0; c < desc->n_caps; ++c) {
      const pp_capability& cap = desc->caps[c];
      if (cap.component != PP_COMPONENT_EVALUATOR ||
          device_name_of(cap.device, cap.device_name) != request.device)
        continue;
      if (!device_ok) device.type = cap.device;
      device_ok = true;
      dtype_ok = dtype_ok || (cap.dtypes & PP_DTYPE_BIT(dtype)) != 0;
      autocast_ok = autocast_ok || (cap.flags & autocast_flag) != 0;
    }
    if (!device_ok) {
      decline("it has no evaluator for device " + request.device);
      continue;
    }
    if (!dtype_ok) {
      decline("its evaluators do not compute in " + std::string(to_string(request.options.dtype)));
      continue;
    }
    if (!autocast_ok) {
      // A plugin that does not declare it would not read the field: it is never sent.
      decline("it does not offer candidate_autocast in " + autocast_name + " on " + request.device);
      continue;
    }
    if (desc->session_supports != nullptr) {
      pp_error why{};
      const char* path = request.path.empty() ? nullptr : request.path.c_str();
      const pp_session_options options =
          detail::to_pp_options(request.options, device, subspace_view.get(), path);
      if (desc->session_supports(path, view.get(), &loss_view.view, &options, &why) == 0) {
        decline(detail::error_text(why));
        continue;
      }
    }
    sel.reasons.push_back(info.name + ": can serve (score " + std::to_string(info.score) + ")");
    candidates.push_back({info.score, info.name, desc, std::move(device)});
  }

  const Candidate* chosen = nullptr;
  if (!automatic) {
    for (const Candidate& c : candidates)
      if (c.name == backend) chosen = &c;
    if (chosen == nullptr)
      throw Error("backend '" + backend + "' cannot serve this model: " +
                  (explicit_reason.empty() ? std::string("it declined") : explicit_reason));
    sel.reasons.push_back(backend + ": chosen: requested with --backend");
  } else {
    // Policy (the device) already filtered; then the highest score, then the name.
    for (const Candidate& c : candidates)
      if (chosen == nullptr || c.score > chosen->score ||
          (c.score == chosen->score && c.name < chosen->name))
        chosen = &c;
    if (chosen == nullptr) {
      if (autocast_flag != 0)
        throw Error("no plugin can run candidate_autocast (--candidate-dtype " + autocast_name +
                    ") for this model on " + request.device +
                    " (the cuda plugin offers it with --device cuda --dtype float32); "
                    "`polyprobe explain` says why each backend declined");
      if (request.device != PP_DEVICE_NAME_CPU)
        throw Error("no plugin can evaluate on " + request.device +
                    "; `polyprobe plugins` lists what was found and why");
      sel.chosen = "reference";
      sel.reasons.emplace_back(
          "reference: chosen: no plugin can serve, so the core's reference evaluator runs "
          "(correct but slow)");
      return make_reference_evaluator(model, loss, request.subspace, request.options);
    }
    sel.reasons.push_back(chosen->name + ": chosen: highest score among those that can serve");
  }
  sel.chosen = chosen->name;
  return detail::make_plugin_evaluator(chosen->desc, model, loss, request.options, chosen->device,
                                       request.subspace, request.path, operations_);
}

std::vector<std::string> PluginRegistry::device_names() const {
  std::vector<std::string> names = {PP_DEVICE_NAME_CPU, PP_DEVICE_NAME_CUDA};
  for (const PluginInfo& info : infos_)
    if (info.loaded)
      for (const CapabilityInfo& c : info.capabilities) names.push_back(c.device);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

std::vector<NamedComponent> PluginRegistry::subspace_kinds() const {
  std::vector<NamedComponent> kinds;
  for (const SubspaceKind& k : polyprobe::subspace_kinds())
    kinds.push_back({k.name, "core", k.summary});
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    if (!infos_[i].available) continue;
    for (const pp_subspace_kind& k : subspace_kinds_of(descriptors_[i]))
      if (std::none_of(kinds.begin(), kinds.end(),
                       [&](const NamedComponent& c) { return c.name == k.kind; }))
        kinds.push_back({k.kind, infos_[i].name, safe(k.summary)});
  }
  return kinds;
}

namespace {

std::string names_of(const std::vector<NamedComponent>& components) {
  std::string text;
  for (const NamedComponent& c : components) text += (text.empty() ? "" : ", ") + c.name;
  return text;
}

}  // namespace

std::unique_ptr<Subspace> PluginRegistry::make_subspace(const Model& model,
                                                        const SubspaceSettings& settings) const {
  const std::string& kind = settings.kind;
  if (find_subspace_kind(kind) != nullptr) return polyprobe::make_subspace(model, settings);
  if (settings.rank <= 0)
    throw Error("subspace '" + kind + "': the rank must be positive, got " +
                std::to_string(settings.rank));
  if (settings.max_subspace_dim < 0)
    throw Error("subspace '" + kind + "': the dimension bound must be >= 0 (0 = none), got " +
                std::to_string(settings.max_subspace_dim));
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    if (!infos_[i].available) continue;
    for (const pp_subspace_kind& k : subspace_kinds_of(descriptors_[i]))
      if (kind == k.kind) return detail::make_plugin_subspace(&k, infos_[i].name, model, settings);
  }
  // The plugin may be loaded but unusable (its descriptor is kept only when loaded).
  std::string why;
  for (std::size_t i = 0; i < infos_.size() && why.empty(); ++i)
    for (const pp_subspace_kind& k : subspace_kinds_of(descriptors_[i]))
      if (kind == k.kind)
        why = "; plugin '" + infos_[i].name + "' (" + infos_[i].path.string() +
              ") provides it but is unavailable: " + infos_[i].reason;
  if (why.empty())
    why =
        "; a plugin provides it only when it is on the plugin path (--plugin-dir, "
        "POLYPROBE_PLUGIN_PATH); `polyprobe plugins` lists the subspace kinds found";
  throw Error("unknown subspace kind '" + kind + "' (known: " + names_of(subspace_kinds()) + ")" +
              why);
}

std::vector<NamedComponent> PluginRegistry::radius_models() const {
  std::vector<NamedComponent> models = {
      {"fixed", "core", "the schedule alone"},
      {"adaptive", "core", "stagnation-based radius"},
      {"quadratic", "core", "finite-difference model chooses the step length"},
      {"trust_region", "core", "quadratic with a radius that follows actual / predicted decrease"}};
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    if (!infos_[i].available) continue;
    for (const pp_radius_model_kind& k : radius_models_of(descriptors_[i]))
      if (std::none_of(models.begin(), models.end(),
                       [&](const NamedComponent& c) { return c.name == k.name; }))
        models.push_back({k.name, infos_[i].name, safe(k.summary)});
  }
  return models;
}

void PluginRegistry::choose_radius_model(const std::string& name, OptimizerConfig& config,
                                         bool subspace, const std::string& options_json) const {
  RadiusModelSettings& settings = config.radius;
  if (is_builtin_radius_model(name)) {
    if (options_json != "{}" && !options_json.empty())
      throw Error("radius model '" + name +
                  "' is built in and takes its settings from the optimizer's options, not from "
                  "radius options '" +
                  options_json + "'");
    settings.kind = parse_radius_model(name);
    settings.plugin_name.clear();
    settings.plugin_factory = nullptr;
    return;
  }
  const pp_radius_model_kind* chosen = nullptr;
  std::string plugin;
  for (std::size_t i = 0; i < infos_.size() && chosen == nullptr; ++i) {
    if (!infos_[i].available) continue;
    for (const pp_radius_model_kind& k : radius_models_of(descriptors_[i]))
      if (name == k.name && chosen == nullptr) chosen = &k, plugin = infos_[i].name;
  }
  if (chosen == nullptr) {
    std::string why;
    for (std::size_t i = 0; i < infos_.size() && why.empty(); ++i)
      for (const pp_radius_model_kind& k : radius_models_of(descriptors_[i]))
        if (name == k.name)
          why = "; plugin '" + infos_[i].name + "' (" + infos_[i].path.string() +
                ") provides it but is unavailable: " + infos_[i].reason;
    if (why.empty())
      why =
          "; a plugin provides it only when it is on the plugin path (--plugin-dir, "
          "POLYPROBE_PLUGIN_PATH); `polyprobe plugins` lists the radius models found";
    throw Error("unknown radius model '" + name + "' (known: " + names_of(radius_models()) + ")" +
                why);
  }
  const int32_t d = subspace ? config.subspace_particle_dim : config.particle_dim;
  // The factory keeps its own copies: the config it is made from may not outlive it.
  auto options = std::make_shared<const std::string>(options_json.empty() ? "{}" : options_json);
  pp_radius_config c{};
  c.struct_size = sizeof(c);
  c.step_radius = config.step_radius;
  c.probe_radius = config.probe_radius;
  c.total_steps = config.total_steps;
  c.particle_dim = d;
  c.n_vertices = static_cast<int32_t>(polytope_vertex_count(config.polytope, d));
  c.n_probes = config.num_probe;
  c.subspace = subspace ? 1 : 0;
  settings.kind = RadiusModelKind::plugin;
  settings.plugin_name = name;
  settings.plugin_factory = [chosen, plugin, options, c]() mutable {
    c.options_json = options->c_str();
    return detail::make_plugin_radius_model(chosen, plugin, c);
  };
  settings.plugin_factory();  // a refused configuration is an error now, with its reason
}

nlohmann::json PluginRegistry::run_plugin_bench(const std::string& plugin, const std::string& suite,
                                                const nlohmann::json& options) const {
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    const PluginInfo& info = infos_[i];
    const pp_plugin* desc = descriptors_[i];
    if (!info.loaded || info.name != plugin || desc == nullptr) continue;
    if (!info.available) throw Error("plugin '" + plugin + "' is unavailable here: " + info.reason);
    if (!PP_HAS_FIELD(desc, pp_plugin, bench) || desc->bench == nullptr)
      throw Error("plugin '" + plugin + "' offers no benchmarks of its own");
    pp_error err{};
    const char* result = nullptr;
    const std::string text = options.dump();
    if (desc->bench(suite.c_str(), text.c_str(), &result, &err) != PP_OK || result == nullptr)
      throw Error("plugin '" + plugin + "', benchmark '" + suite + "': " + detail::error_text(err));
    try {
      return nlohmann::json::parse(result);
    } catch (const nlohmann::json::exception& e) {
      throw Error("plugin '" + plugin + "', benchmark '" + suite +
                  "' returned malformed JSON: " + e.what());
    }
  }
  throw Error("no plugin named '" + plugin + "' is loaded (see `polyprobe plugins`)");
}

std::unique_ptr<Accumulator> PluginRegistry::make_accumulator(const std::string& backend,
                                                              const std::string& strategy,
                                                              int threads,
                                                              Selection* selection) const {
  Selection local;
  Selection& sel = selection != nullptr ? *selection : local;
  sel = Selection{"accumulator", "", {}};
  if (backend == "reference") {
    sel.chosen = "reference";
    sel.reasons.emplace_back("reference: requested");
    return make_reference_accumulator();
  }
  const bool automatic = backend.empty() || backend == "auto";
  const pp_plugin* chosen = nullptr;
  int best = -1;
  for (std::size_t i = 0; i < infos_.size(); ++i) {
    const PluginInfo& info = infos_[i];
    if (!automatic && info.name != backend) continue;
    const pp_plugin* desc = descriptors_[i];
    // Choosing by score takes host accumulators only (the core's calls pass host memory, and
    // a device accumulator would stage it); a device one serves when named.
    bool declared = false;
    if (info.available && desc != nullptr && desc->accumulator_create != nullptr)
      for (int32_t c = 0; c < desc->n_caps; ++c)
        declared = declared || (desc->caps[c].component == PP_COMPONENT_ACCUMULATOR &&
                                (!automatic || desc->caps[c].device == PP_DEVICE_TYPE_CPU) &&
                                strategy == safe(desc->caps[c].name));
    if (!declared) {
      sel.reasons.push_back(info.name + ": declined: no " + (automatic ? "cpu " : "") +
                            "accumulator '" + strategy + "'" +
                            (info.available ? "" : " (" + info.reason + ")"));
      continue;
    }
    sel.reasons.push_back(info.name + ": can serve (score " + std::to_string(info.score) + ")");
    if (info.score > best) best = info.score, chosen = desc;
  }
  if (chosen == nullptr) {
    if (!automatic)
      throw Error("backend '" + backend + "' has no accumulator '" + strategy +
                  "'; `polyprobe plugins` lists them");
    sel.chosen = "reference";
    sel.reasons.push_back("reference: chosen: no plugin declares accumulator '" + strategy + "'");
    return make_reference_accumulator();
  }
  sel.chosen = chosen->name;
  return detail::make_plugin_accumulator(chosen, strategy, threads);
}

}  // namespace polyprobe
