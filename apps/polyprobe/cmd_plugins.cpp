// `polyprobe plugins`: what was found on the plugin search path, and why anything is not
// usable.
#include "cli.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>

namespace polyprobe::app {
namespace {

nlohmann::json to_json(const PluginInfo& info) {
  nlohmann::json caps = nlohmann::json::array();
  for (const CapabilityInfo& c : info.capabilities)
    caps.push_back({{"component", c.component},
                    {"name", c.name},
                    {"device", c.device},
                    {"device_type", c.device_type},
                    {"dtypes", c.dtypes},
                    {"candidate_dtypes", c.candidate_dtypes},
                    {"summary", c.summary}});
  return {{"name", info.name},           {"version", info.version},
          {"vendor", info.vendor},       {"abi", info.abi},
          {"path", info.path.string()},  {"loaded", info.loaded},
          {"available", info.available}, {"score", info.score},
          {"reason", info.reason},       {"summary", info.summary},
          {"capabilities", caps}};
}

int run(Context& ctx) {
  const auto& plugins = ctx.registry.plugins();
  // The search path exactly as load_plugins() applied it: --plugin-dir in the order given,
  // then POLYPROBE_PLUGIN_PATH, then the install's own folder.
  std::vector<std::filesystem::path> explicit_dirs;
  if (ctx.vm.count("plugin-dir"))
    for (const auto& d : ctx.vm["plugin-dir"].as<std::vector<std::string>>())
      explicit_dirs.emplace_back(d);
  std::vector<std::string> search;
  for (const auto& dir : PluginRegistry::search_path(explicit_dirs)) search.push_back(dir.string());
  if (ctx.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const PluginInfo& info : plugins) list.push_back(to_json(info));
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& [kind, entry] : ctx.layers.kinds())
      layers.push_back({{"kind", kind}, {"provider", entry.provider}, {"summary", entry.summary}});
    const auto named = [](const std::vector<NamedComponent>& components) {
      nlohmann::json j = nlohmann::json::array();
      for (const NamedComponent& c : components)
        j.push_back({{"name", c.name}, {"provider", c.provider}, {"summary", c.summary}});
      return j;
    };
    *ctx.out << nlohmann::json{{"plugin_api", PP_PLUGIN_API_VERSION},
                               {"search_path", search},
                               {"plugins", list},
                               {"layer_kinds", layers},
                               {"subspace_kinds", named(ctx.registry.subspace_kinds())},
                               {"radius_models", named(ctx.registry.radius_models())}}
                    .dump(2)
             << "\n";
    return 0;
  }
  std::ostream& out = *ctx.out;
  out << "plugin search path (first match of a name wins):\n";
  for (const auto& dir : search) out << "  " << dir << "\n";
  if (plugins.empty()) {
    out << "\nno plugins found; the core's reference evaluator serves every request.\n";
    return 0;
  }
  // Columns as wide as their longest entry (at least the usual widths), two spaces apart.
  std::size_t name_w = 16, version_w = 10;
  for (const PluginInfo& info : plugins) {
    name_w = std::max(name_w, info.name.size() + 2);
    version_w = std::max(version_w, info.version.size() + 2);
  }
  const int nw = static_cast<int>(name_w), vw = static_cast<int>(version_w);
  out << "\n"
      << std::left << std::setw(nw) << "NAME" << std::setw(vw) << "VERSION" << std::setw(5) << "ABI"
      << std::setw(13) << "STATUS" << std::setw(7) << "SCORE"
      << "PATH\n";
  for (const PluginInfo& info : plugins) {
    out << std::setw(nw) << info.name << std::setw(vw)
        << (info.version.empty() ? "-" : info.version) << std::setw(5)
        << (info.abi ? std::to_string(info.abi) : "-") << std::setw(13)
        << (info.available ? "available" : "unavailable") << std::setw(7) << info.score
        << info.path.string() << "\n";
    if (!info.reason.empty()) out << "    why: " << info.reason << "\n";
    for (const CapabilityInfo& c : info.capabilities) {
      std::string dtypes;
      for (const auto& t : c.dtypes) dtypes += (dtypes.empty() ? "" : ",") + t;
      for (const auto& t : c.candidate_dtypes) dtypes += "," + t + " candidates";
      // Subspace kinds and radius models run on the host: no device, no dtype.
      const bool host_side = c.component == "subspace" || c.component == "radius_model";
      out << "    " << c.component << " " << c.name
          << (host_side ? "" : " [" + c.device_type + "/" + c.device + "; " + dtypes + "]")
          << (c.summary.empty() ? "" : ": " + c.summary) << "\n";
    }
  }
  const auto names = [](const std::vector<NamedComponent>& components) {
    std::string text;
    for (const NamedComponent& c : components)
      text += (text.empty() ? "" : ", ") + c.name +
              (c.provider == "core" ? "" : " (" + c.provider + ")");
    return text;
  };
  out << "\nsubspace kinds (--subspace): " << names(ctx.registry.subspace_kinds()) << "\n"
      << "radius models (--radius-model): " << names(ctx.registry.radius_models()) << "\n"
      << "\nThe core's reference evaluator is always available (`--backend reference`).\n";
  return 0;
}

}  // namespace

Command plugins_command() {
  Command c;
  c.name = "plugins";
  c.summary = "list the plugins found, what each provides, and why any is unusable";
  c.description =
      "Plugins are shared libraries named libpolyprobe_<name>.so, searched for in --plugin-dir,\n"
      "then the directories of POLYPROBE_PLUGIN_PATH (colon-separated), then the install's\n"
      "plugin folder. A plugin that fails to load is listed with the reason; the others\n"
      "still load.\n\n"
      "examples:\n"
      "  polyprobe plugins\n"
      "  polyprobe plugins --json | jq '.plugins[] | {name, available, reason}'\n"
      "  POLYPROBE_PLUGIN_PATH=$HOME/my-plugins polyprobe plugins";
  c.options = [](po::options_description& o, po::positional_options_description&) {
    o.add_options()("json", po::bool_switch(), "machine-readable output");
  };
  c.run = run;
  return c;
}

}  // namespace polyprobe::app
