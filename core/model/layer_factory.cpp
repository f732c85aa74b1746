#include <polyprobe/error.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/operations.hpp>

#include "layers/builtin.hpp"

#include <nlohmann/json.hpp>

namespace polyprobe {

LayerFactory::LayerFactory() : operations_(std::make_shared<OperationTable>()) {}

LayerFactory LayerFactory::with_builtins() {
  LayerFactory factory;
  register_builtin_layers(factory);
  return factory;
}

void LayerFactory::add(const std::string& kind, Entry entry) {
  if (kinds_.contains(kind))
    throw Error("layer kind '" + kind + "' is already provided by " + kinds_.at(kind).provider);
  kinds_.emplace(kind, std::move(entry));
}

std::shared_ptr<const Layer> LayerFactory::create(const std::string& kind,
                                                  const nlohmann::json& attrs,
                                                  const Shape& input_shape) const {
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) {
    std::string known;
    for (const auto& [name, entry] : kinds_) known += (known.empty() ? "" : ", ") + name;
    throw Error("unknown layer kind '" + kind + "' (known: " + known +
                "); a plugin may provide it: see `polyprobe plugins`");
  }
  return it->second.create(attrs, input_shape);
}

}  // namespace polyprobe
