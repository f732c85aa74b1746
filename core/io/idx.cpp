// IDX arrays (the MNIST file format): a 4-byte magic (0, 0, type, rank), `rank` big-endian
// 32-bit dimensions, then the values, big-endian.
#include <polyprobe/data.hpp>
#include <polyprobe/error.hpp>

#include "io/file_util.hpp"

#include <cmath>
#include <cstring>

namespace polyprobe {
namespace {

constexpr uint64_t kMaxIdxBytes = uint64_t{4} << 30;

uint64_t big_endian(const uint8_t* p, std::size_t bytes) {
  uint64_t v = 0;
  for (std::size_t i = 0; i < bytes; ++i) v = (v << 8) | p[i];
  return v;
}

// Size in bytes of one value of IDX type `code`, or 0 when the code is unknown.
std::size_t type_size(uint8_t code) {
  switch (code) {
    case 0x08:
    case 0x09:
      return 1;  // unsigned / signed byte
    case 0x0B:
      return 2;  // int16
    case 0x0C:
    case 0x0D:
      return 4;  // int32 / float32
    case 0x0E:
      return 8;  // float64
    default:
      return 0;
  }
}

double decode(const uint8_t* p, uint8_t code) {
  switch (code) {
    case 0x08:
      return p[0];
    case 0x09:
      return static_cast<int8_t>(p[0]);
    case 0x0B:
      return static_cast<int16_t>(big_endian(p, 2));
    case 0x0C:
      return static_cast<int32_t>(big_endian(p, 4));
    case 0x0D: {
      const auto bits = static_cast<uint32_t>(big_endian(p, 4));
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default: {
      const uint64_t bits = big_endian(p, 8);
      double d;
      std::memcpy(&d, &bits, 8);
      return d;
    }
  }
}

}  // namespace

IdxArray parse_idx(std::span<const uint8_t> bytes, const std::string& source) {
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0)
    throw Error("'" + source +
                "' is not an IDX file: it must start with two zero bytes, a type "
                "and a rank (offset 0)");
  const uint8_t code = bytes[2];
  const std::size_t item = type_size(code);
  if (item == 0)
    throw Error("'" + source + "': unknown IDX value type 0x" + std::to_string(code) +
                " at offset 2");
  const std::size_t rank = bytes[3];
  if (rank == 0) throw Error("'" + source + "': IDX rank 0 at offset 3 (no dimensions)");
  const std::size_t header = 4 + 4 * rank;
  if (bytes.size() < header)
    throw Error("'" + source + "': truncated IDX header (" + std::to_string(bytes.size()) +
                " bytes, the header needs " + std::to_string(header) + ")");
  IdxArray array;
  const uint64_t available = (bytes.size() - header) / item;
  uint64_t count = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    const uint64_t dim = big_endian(bytes.data() + 4 + 4 * d, 4);
    if (dim != 0 && count > available / dim)
      throw Error("'" + source + "': the dimensions at offset 4 declare more values than the " +
                  std::to_string(bytes.size()) + "-byte file holds; it is truncated or corrupt");
    count *= dim;
    array.dims.push_back(static_cast<int64_t>(dim));
  }
  if (count * item != bytes.size() - header)
    throw Error("'" + source + "': the header declares " + std::to_string(count) + " values (" +
                std::to_string(count * item) + " bytes from offset " + std::to_string(header) +
                "), but the file has " + std::to_string(bytes.size() - header) +
                " data bytes; it is truncated or corrupt");
  array.values.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const double v = decode(bytes.data() + header + i * item, code);
    if (!std::isfinite(v))
      throw Error("'" + source + "': value " + std::to_string(i) + " (offset " +
                  std::to_string(header + i * item) + ") is not finite");
    array.values[i] = v;
  }
  return array;
}

Dataset read_idx(const std::filesystem::path& images_path,
                 const std::filesystem::path& labels_path) {
  const IdxArray images =
      parse_idx(io::read_maybe_gzip(images_path, kMaxIdxBytes), images_path.string());
  const IdxArray labels =
      parse_idx(io::read_maybe_gzip(labels_path, kMaxIdxBytes), labels_path.string());
  if (labels.dims.size() != 1)
    throw Error("'" + labels_path.string() + "': labels must be a 1-D IDX array, got rank " +
                std::to_string(labels.dims.size()));
  const int64_t n = images.dims[0];
  if (labels.dims[0] != n)
    throw Error("'" + labels_path.string() + "' has " + std::to_string(labels.dims[0]) +
                " labels but '" + images_path.string() + "' has " + std::to_string(n) + " images");
  if (n == 0) throw Error("'" + images_path.string() + "' holds no samples");
  Dataset data;
  data.name = images_path.filename().string();
  // Images [n, H, W] become [1, H, W] samples (one channel), ready for conv2d.
  data.sample_shape.dims.assign(images.dims.begin() + 1, images.dims.end());
  if (data.sample_shape.dims.size() == 2)
    data.sample_shape.dims.insert(data.sample_shape.dims.begin(), 1);
  if (data.sample_shape.dims.empty()) data.sample_shape.dims = {1};
  const int64_t features = static_cast<int64_t>(images.values.size()) / n;
  data.features = Eigen::Map<const Matrix<double>>(images.values.data(), n, features);
  int64_t max_label = 0;
  for (std::size_t i = 0; i < labels.values.size(); ++i) {
    const double l = labels.values[i];
    if (l < 0 || l != std::floor(l) || l >= 1 << 20)
      throw Error("'" + labels_path.string() + "': label " + std::to_string(i) + " is " +
                  std::to_string(l) + ", not a class index");
    data.labels.push_back(static_cast<int64_t>(l));
    max_label = std::max(max_label, data.labels.back());
  }
  data.num_classes = max_label + 1;
  return data;
}

}  // namespace polyprobe
