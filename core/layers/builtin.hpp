// The core's built-in layer kinds and the helpers their constructors share.
#pragma once

#include <polyprobe/error.hpp>
#include <polyprobe/model.hpp>

#include <nlohmann/json.hpp>

#include <string>
#include <type_traits>

namespace polyprobe {

// Adds every built-in kind ("linear", "relu", ...) to `factory`.
void register_builtin_layers(LayerFactory& factory);

// Registration functions of the individual layer files.
void register_linear(LayerFactory& factory);
void register_elementwise(LayerFactory& factory);
void register_layer_norm(LayerFactory& factory);
void register_conv(LayerFactory& factory);
void register_pool(LayerFactory& factory);
void register_attention(LayerFactory& factory);
void register_moe(LayerFactory& factory);
void register_lif(LayerFactory& factory);
void register_cheri_block(LayerFactory& factory);

// Attribute access with errors that name the layer kind and the attribute.
template <class T>
T attr_or(const nlohmann::json& attrs, const char* kind, const char* name, T fallback) {
  if (!attrs.is_object() || !attrs.contains(name)) return fallback;
  const nlohmann::json& value = attrs.at(name);
  // nlohmann converts between number kinds silently (2.5 -> 2); an attribute must be exact.
  bool fits = true;
  if constexpr (std::is_same_v<T, bool>)
    fits = value.is_boolean();
  else if constexpr (std::is_integral_v<T>)
    fits = value.is_number_integer();
  else if constexpr (std::is_floating_point_v<T>)
    fits = value.is_number();
  else
    fits = value.is_string();
  if (fits) {
    try {
      return value.get<T>();
    } catch (const nlohmann::json::exception&) {
    }
  }
  throw Error(std::string("layer '") + kind + "': attribute '" + name + "' has the wrong type (" +
              value.dump() + ")");
}

template <class T>
T attr_required(const nlohmann::json& attrs, const char* kind, const char* name) {
  if (!attrs.is_object() || !attrs.contains(name))
    throw Error(std::string("layer '") + kind + "': missing attribute '" + name + "'");
  return attr_or<T>(attrs, kind, name, T{});
}

// Throws unless attrs is an object whose keys are all in `allowed` (typos are errors).
void check_attribute_names(const nlohmann::json& attrs, const char* kind,
                           std::initializer_list<const char*> allowed);

}  // namespace polyprobe
