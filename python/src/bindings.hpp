// Shared pieces of the Python module polyprobe._core: error translation, the process-wide
// plugin registry, and the conversions every binding uses.
//
// Errors: a polyprobe::Error raised while checking what Python passed in is a ValueError
// (bad_input), one raised while the core works is a RuntimeError (the module's translator);
// both carry the core's one-line message. A Python exception raised inside a callback the
// core calls (an objective, a progress function) is parked with PyErr_Restore, the core is
// unwound with PythonCallbackError, and the original exception is raised again once the GIL
// is held by the binding.
#pragma once

#include <polyprobe/error.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/model_file.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/registry.hpp>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace polyprobe::python {

namespace py = pybind11;

// Unwinds the core after a Python callback raised; the exception waits in PyErr.
struct PythonCallbackError {};

// Raised as ValueError by the module's translator.
class BadInput : public Error {
 public:
  using Error::Error;
};

// Runs `body` and turns a polyprobe::Error into BadInput (a ValueError).
template <class F>
auto bad_input(F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const BadInput&) {
    throw;
  } catch (const Error& e) {
    throw BadInput(e.what());
  }
}

// Runs `body` without the GIL; a parked Python exception is raised again after.
template <class F>
auto without_gil(F&& body) -> decltype(body()) {
  try {
    py::gil_scoped_release release;
    return body();
  } catch (const PythonCallbackError&) {
    throw py::error_already_set();
  }
}

// Calls back into Python from a core thread that released the GIL.
template <class F>
auto with_gil(F&& body) -> decltype(body()) {
  py::gil_scoped_acquire acquire;
  try {
    return body();
  } catch (py::error_already_set& e) {
    e.restore();
    throw PythonCallbackError{};
  }
}

// The plugins and the layer kinds they add, loaded once per process from `dirs` (the
// Python side passes --plugin-dir's equivalents, POLYPROBE_PLUGIN_PATH and the package's
// plugin folder, in that order).
struct Plugins {
  PluginRegistry registry;
  LayerFactory layers = LayerFactory::with_builtins();
  std::vector<std::filesystem::path> dirs;
};
Plugins& plugins();
bool plugins_loaded();
void load_plugins(const std::vector<std::string>& dirs, const std::vector<std::string>& withheld);

// An OptimizerConfig from None, an OptimizerConfig or a dict of option names (ValueError
// for an unknown name or a bad value).
OptimizerConfig to_config(py::handle config);
py::dict config_dict(const OptimizerConfig& config);

// A C-contiguous float64 array from anything numpy can read (zero-copy when it already is
// one), with `what` naming it in errors.
py::array_t<double, py::array::c_style> as_f64(py::handle array, const char* what);
// Throws BadInput when `bytes` (what `what` would allocate) exceed this machine's memory, so a
// size that cannot fit is refused before the allocation, naming it.
void check_fits_memory(double bytes, const std::string& what);
// The error for an allocation of `what` that failed (a MemoryError that says what it was).
py::error_already_set out_of_memory(const std::string& what);
// Throws BadInput unless every value is finite ("`what` has a NaN at index i").
void check_finite(std::span<const double> values, const std::string& what);

// The host app's backend options (--backend, --device, --dtype, --threads) as a request.
EvaluatorRequest evaluator_request(const std::string& backend, const std::string& device,
                                   const std::string& dtype, int threads);

// The Python Model: a model with its training objective's defaults (a model file).
struct PyModel {
  ModelFile file;
};

void bind_config(py::module_& m);
void bind_blackbox(py::module_& m);
void bind_models(py::module_& m);
void bind_training(py::module_& m);

}  // namespace polyprobe::python
