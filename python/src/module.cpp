// polyprobe._core: the module's entry, the error translator and the plugin registry.
#include "bindings.hpp"

#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <memory>
#include <sstream>

namespace polyprobe::python {
namespace {

std::unique_ptr<Plugins> g_plugins;

py::dict plugin_dict(const PluginInfo& info) {
  py::list caps;
  for (const CapabilityInfo& c : info.capabilities) {
    py::dict d;
    d["component"] = c.component;
    d["name"] = c.name;
    d["device"] = c.device;
    d["device_type"] = c.device_type;
    d["dtypes"] = c.dtypes;
    d["candidate_dtypes"] = c.candidate_dtypes;
    d["summary"] = c.summary;
    caps.append(d);
  }
  py::dict d;
  d["name"] = info.name;
  d["version"] = info.version;
  d["vendor"] = info.vendor;
  d["summary"] = info.summary;
  d["path"] = info.path.string();
  d["abi"] = info.abi;
  d["loaded"] = info.loaded;
  d["available"] = info.available;
  d["score"] = info.score;
  d["reason"] = info.reason;
  d["capabilities"] = caps;
  return d;
}

}  // namespace

Plugins& plugins() {
  if (!g_plugins)
    throw Error("polyprobe's plugins are not loaded; use the `polyprobe` package, not `_core`");
  return *g_plugins;
}

bool plugins_loaded() { return g_plugins != nullptr; }

void load_plugins(const std::vector<std::string>& dirs, const std::vector<std::string>& withheld) {
  if (g_plugins)
    throw Error(
        "plugins are already loaded (from the folders polyprobe.plugin_dirs() lists); "
        "choose plugin folders before the first call that needs them");
  auto p = std::make_unique<Plugins>();
  for (const std::string& d : dirs) p->dirs.emplace_back(d);
  for (const std::string& name : withheld) p->registry.withhold_operation(name);
  p->registry.load_directories(p->dirs);
  // As `polyprobe` prints them on stderr: unsafe plugin folders, a plugin that shadows another.
  for (const std::string& warning : p->registry.warnings())
    if (PyErr_WarnEx(PyExc_UserWarning, ("polyprobe: " + warning).c_str(), 1) != 0)
      throw py::error_already_set();
  const std::vector<std::string> offered = p->registry.offered_operations();
  for (const std::string& name : withheld)
    if (std::find(offered.begin(), offered.end(), name) == offered.end()) {
      std::string known;
      for (const std::string& o : offered) known += (known.empty() ? "" : ", ") + o;
      throw BadInput(
          "withhold_operations: no loaded plugin offers '" + name + "' (" +
          (known.empty() ? std::string("none offers any operation") : "offered: " + known) + ")");
    }
  p->registry.register_layers(p->layers);
  g_plugins = std::move(p);
}

py::array_t<double, py::array::c_style> as_f64(py::handle array, const char* what) {
  auto a = py::array_t<double, py::array::c_style>::ensure(array);
  if (!a) {
    PyErr_Clear();
    throw BadInput(std::string(what) + " must be an array of numbers (got " +
                   std::string(py::str(py::type::handle_of(array).attr("__name__"))) + ")");
  }
  return a;
}

void check_fits_memory(double bytes, const std::string& what) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  const double memory = static_cast<double>(pages) * static_cast<double>(page);
  if (pages > 0 && page > 0 && bytes > memory) {
    std::ostringstream text;
    text << std::setprecision(3) << what << " needs at least " << bytes / 1e9
         << " GB, more than this machine's " << memory / 1e9 << " GB";
    throw BadInput(text.str());
  }
}

py::error_already_set out_of_memory(const std::string& what) {
  PyErr_SetString(PyExc_MemoryError,
                  ("out of memory: " + what + " is more than this machine can hold").c_str());
  return py::error_already_set();
}

void check_finite(std::span<const double> values, const std::string& what) {
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      throw BadInput(what + " has a non-finite value (" + std::to_string(values[i]) +
                     ") at index " + std::to_string(i));
}

}  // namespace polyprobe::python

PYBIND11_MODULE(_core, m) {
  using namespace polyprobe::python;
  m.doc() = "polyprobe's C++ core (use the `polyprobe` package, which wraps it)";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const BadInput& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const polyprobe::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const PythonCallbackError&) {
      // The Python exception is already set.
    }
  });
  m.def("load_plugins", &load_plugins, py::arg("dirs"),
        py::arg("withheld") = std::vector<std::string>{},
        "Loads the plugins of `dirs` (in order) once per process, without the named "
        "operations in `withheld`.");
  m.def("plugins_loaded", &plugins_loaded, "Whether the plugins were loaded.");
  m.def(
      "plugin_dirs",
      [] {
        std::vector<std::string> out;
        for (const auto& d : plugins().dirs) out.push_back(d.string());
        return out;
      },
      "The folders searched for plugins, in order.");
  m.def(
      "plugins",
      [] {
        py::list out;
        for (const polyprobe::PluginInfo& info : plugins().registry.plugins())
          out.append(plugin_dict(info));
        return out;
      },
      "Every plugin library found: name, version, capabilities, and why any is unusable.");
  m.def(
      "devices", [] { return plugins().registry.device_names(); },
      "The device names device= accepts: cpu, cuda and any a loaded plugin declares.");
  m.def(
      "layer_kinds",
      [] {
        py::dict out;
        for (const auto& [kind, entry] : plugins().layers.kinds())
          out[py::str(kind)] = py::make_tuple(entry.provider, entry.summary);
        return out;
      },
      "Layer kinds a model may use: kind -> (provider, summary).");
  bind_config(m);
  bind_blackbox(m);
  bind_models(m);
  bind_training(m);
}
