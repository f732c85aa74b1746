#include "layers/ops.hpp"

#include "layers/builtin.hpp"

#include <algorithm>

namespace polyprobe::layers {

std::array<int64_t, 2> spatial_attribute(const nlohmann::json& attrs, const char* kind,
                                         const char* name, int dims, int64_t fallback,
                                         int64_t minimum) {
  const auto fail = [&](const std::string& why) {
    return Error(std::string("layer '") + kind + "': attribute '" + name + "' " + why);
  };
  std::array<int64_t, 2> value{dims == 1 ? 1 : fallback, fallback};
  if (!attrs.is_object() || !attrs.contains(name)) {
    if (fallback < minimum) throw fail("is required");
    return value;
  }
  const nlohmann::json& v = attrs.at(name);
  std::vector<int64_t> given;
  if (v.is_number_integer()) {
    given.assign(static_cast<std::size_t>(dims), v.get<int64_t>());
  } else if (v.is_array() && v.size() == static_cast<std::size_t>(dims) &&
             std::all_of(v.begin(), v.end(), [](const auto& e) { return e.is_number_integer(); })) {
    for (const auto& e : v) given.push_back(e.get<int64_t>());
  } else {
    throw fail("must be an integer or a list of " + std::to_string(dims) + " integers, got " +
               v.dump());
  }
  for (int64_t g : given)
    if (g < minimum || g > (int64_t{1} << 24))
      throw fail("must be between " + std::to_string(minimum) + " and 2^24, got " + v.dump());
  if (dims == 1)
    value = {1, given[0]};
  else
    value = {given[0], given[1]};
  return value;
}

Window Window::parse(const nlohmann::json& attrs, const char* kind, int dims,
                     const std::array<int64_t, 2>& in, bool with_dilation, bool stride_is_kernel) {
  Window w;
  w.in = in;
  w.kernel = spatial_attribute(attrs, kind, "kernel_size", dims, 0, 1);
  w.stride = stride_is_kernel && !(attrs.is_object() && attrs.contains("stride"))
                 ? w.kernel
                 : spatial_attribute(attrs, kind, "stride", dims, 1, 1);
  w.padding = spatial_attribute(attrs, kind, "padding", dims, 0, 0);
  if (dims == 1) w.padding[0] = 0;
  if (with_dilation) w.dilation = spatial_attribute(attrs, kind, "dilation", dims, 1, 1);
  for (int axis = 0; axis < 2; ++axis) {
    const int64_t span = w.dilation[axis] * (w.kernel[axis] - 1) + 1;
    const int64_t padded = in[axis] + 2 * w.padding[axis];
    if (padded < span)
      throw Error(std::string("layer '") + kind + "': the window (" + std::to_string(span) +
                  " wide with dilation) is larger than the padded input (" +
                  std::to_string(padded) + "); reduce kernel_size or dilation, or pad more");
    w.out[axis] = (padded - span) / w.stride[axis] + 1;
  }
  return w;
}

SpatialInput spatial_input(const Shape& input, const char* kind, int dims) {
  if (input.dims.size() != static_cast<std::size_t>(dims) + 1)
    throw Error(std::string("layer '") + kind + "' needs a per-sample input of shape " +
                (dims == 1 ? "[C, L]" : "[C, H, W]") + ", got " + input.str());
  SpatialInput s;
  s.channels = input.dims[0];
  if (dims == 1)
    s.size = {1, input.dims[1]};
  else
    s.size = {input.dims[1], input.dims[2]};
  return s;
}

Shape spatial_shape(int64_t channels, const std::array<int64_t, 2>& size, int dims) {
  if (dims == 1) return Shape{{channels, size[1]}};
  return Shape{{channels, size[0], size[1]}};
}

}  // namespace polyprobe::layers
