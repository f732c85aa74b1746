#include <polyprobe/error.hpp>
#include <polyprobe/tensor.hpp>

#include <sstream>

namespace polyprobe {

std::string_view to_string(DType dtype) { return dtype == DType::f32 ? "float32" : "float64"; }

DType parse_dtype(std::string_view name) {
  if (name == "float32" || name == "f32") return DType::f32;
  if (name == "float64" || name == "f64") return DType::f64;
  throw Error("unknown dtype '" + std::string(name) + "': use float32 or float64");
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string Shape::str() const {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << ']';
  return out.str();
}

}  // namespace polyprobe
