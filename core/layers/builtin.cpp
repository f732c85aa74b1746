#include "layers/builtin.hpp"

#include <algorithm>

namespace polyprobe {

void register_builtin_layers(LayerFactory& factory) {
  register_linear(factory);
  register_elementwise(factory);
  register_layer_norm(factory);
  register_conv(factory);
  register_pool(factory);
  register_attention(factory);
  register_moe(factory);
  register_lif(factory);
  register_cheri_block(factory);
}

void check_attribute_names(const nlohmann::json& attrs, const char* kind,
                           std::initializer_list<const char*> allowed) {
  if (attrs.is_null()) return;
  if (!attrs.is_object())
    throw Error(std::string("layer '") + kind + "': attributes must be a JSON object, got " +
                attrs.dump());
  for (const auto& item : attrs.items()) {
    const std::string& key = item.key();
    const bool known =
        std::any_of(allowed.begin(), allowed.end(), [&](const char* name) { return key == name; });
    if (!known) {
      std::string names;
      for (const char* name : allowed) names += (names.empty() ? "" : ", ") + std::string(name);
      throw Error(std::string("layer '") + kind + "': unknown attribute '" + key +
                  "' (allowed: " + (names.empty() ? "none" : names) + ")");
    }
  }
}

}  // namespace polyprobe
