#include <polyprobe/layer.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>

namespace polyprobe {

uint32_t LayerContract::flags() const {
  uint32_t f = 0;
  if (elementwise) f |= PP_CONTRACT_ELEMENTWISE;
  if (affine) f |= PP_CONTRACT_AFFINE;
  if (site_local) f |= PP_CONTRACT_SITE_LOCAL;
  if (prefix_reusable) f |= PP_CONTRACT_PREFIX_REUSABLE;
  return f;
}

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

nlohmann::json Layer::attributes() const { return nlohmann::json::object(); }

void Layer::initialize(std::span<double> params, std::mt19937_64&) const {
  std::fill(params.begin(), params.end(), 0.0);
}

int64_t Layer::parameter_count() const {
  int64_t n = 0;
  for (const ParamSpec& p : parameters()) n += p.numel();
  return n;
}

}  // namespace polyprobe
