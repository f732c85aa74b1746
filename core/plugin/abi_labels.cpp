// Labels for the ABI's integer codes and errors, used in every message the host writes about
// a plugin (plugin_impl.hpp). Kept apart from the registry so that code which names plugins'
// codes (the operation table, the fuzz targets' parsers) does not pull in Boost.DLL.
#include <polyprobe/plugin/plugin.hpp>

#include "plugin/plugin_impl.hpp"

#include <cstring>
#include <string>

namespace polyprobe {

namespace detail {

std::string dtype_label(int32_t dtype) {
  const std::string name = pp::dtype_name(dtype);
  return name == "unknown" ? "dtype#" + std::to_string(dtype) : name;
}

std::string component_label(int32_t component) {
  switch (component) {
    case PP_COMPONENT_EVALUATOR:
      return "evaluator";
    case PP_COMPONENT_ACCUMULATOR:
      return "accumulator";
    case PP_COMPONENT_LAYER:
      return "layer";
    case PP_COMPONENT_SUBSPACE:
      return "subspace";
    case PP_COMPONENT_RADIUS_MODEL:
      return "radius_model";
    case PP_COMPONENT_OPERATION:
      return "operation";
    default:
      return "component#" + std::to_string(component);
  }
}

int32_t to_pp_dtype(DType dtype) { return dtype == DType::f32 ? PP_DTYPE_F32 : PP_DTYPE_F64; }

std::string error_text(const pp_error& err) {
  const std::size_t n = strnlen(err.message, sizeof(err.message));
  return n == 0 ? std::string("(no reason given)") : std::string(err.message, n);
}

}  // namespace detail

}  // namespace polyprobe
