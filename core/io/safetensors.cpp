#include <polyprobe/error.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/safetensors.hpp>

#include "io/file_util.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string_view>

namespace polyprobe {
namespace {

// The format's own limit on the header, and ours on a whole weight file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr uint64_t kMaxFileBytes = uint64_t{16} << 30;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; add byte swapping for this platform");

std::size_t dtype_size(const std::string& dtype) {
  if (dtype == "F64") return 8;
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int32_t e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

double decode(const uint8_t* p, const std::string& dtype) {
  if (dtype == "F64") {
    double v;
    std::memcpy(&v, p, 8);
    return v;
  }
  if (dtype == "F32") {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  if (dtype == "BF16") return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
  return half_to_float(h);
}

int64_t checked_numel(const std::vector<int64_t>& shape, uint64_t limit, const std::string& where) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(where + ": negative dimension in shape");
    if (d != 0 && n > limit / static_cast<uint64_t>(d))
      throw Error(where + ": shape declares more elements than the file holds");
    n *= static_cast<uint64_t>(d);
  }
  return static_cast<int64_t>(n);
}

std::string shape_str(const std::vector<int64_t>& shape) { return Shape{shape}.str(); }

}  // namespace

const NamedTensor* TensorFile::find(const std::string& name) const {
  for (const NamedTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

TensorFile parse_safetensors(std::span<const uint8_t> bytes, const std::string& source) {
  // A training checkpoint (core/train/checkpoint.cpp) is the file users most often mistake for
  // weights: say what it is and what reads it.
  constexpr std::string_view checkpoint_magic = "polyprobe-checkpoint ";
  if (bytes.size() >= checkpoint_magic.size() &&
      std::equal(checkpoint_magic.begin(), checkpoint_magic.end(), bytes.begin()))
    throw Error("'" + source +
                "' is a polyprobe training checkpoint, not a weights file: `polyprobe train "
                "--resume` continues it; the weights to evaluate are the --save file of the run "
                "(FILE for FILE.ckpt)");
  if (bytes.size() < 8)
    throw Error("'" + source + "' is not a safetensors file: it has " +
                std::to_string(bytes.size()) + " bytes, fewer than the 8-byte header length");
  uint64_t header_size;
  std::memcpy(&header_size, bytes.data(), 8);
  if (header_size > kMaxHeaderBytes || header_size > bytes.size() - 8)
    throw Error("'" + source + "': header length " + std::to_string(header_size) +
                " (at offset 0) exceeds the file (" + std::to_string(bytes.size()) +
                " bytes); the file is truncated or not safetensors");
  const auto* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_size);
  } catch (const nlohmann::json::exception& e) {
    throw Error("'" + source + "': the JSON header (bytes 8.." + std::to_string(8 + header_size) +
                ") is malformed: " + e.what());
  }
  if (!header.is_object()) throw Error("'" + source + "': the JSON header is not an object");
  const std::span<const uint8_t> data = bytes.subspan(8 + header_size);
  TensorFile file;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw Error("'" + source + "': __metadata__ is not an object");
      for (const auto& [key, value] : entry.items())
        if (value.is_string()) file.metadata[key] = value.get<std::string>();
      continue;
    }
    const std::string where = "'" + source + "', tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      throw Error(where + ": needs dtype, shape and data_offsets");
    const nlohmann::json& dt = entry["dtype"];
    const nlohmann::json& sh = entry["shape"];
    const nlohmann::json& off = entry["data_offsets"];
    if (!dt.is_string()) throw Error(where + ": dtype is not a string");
    NamedTensor tensor;
    tensor.name = name;
    tensor.dtype = dt.get<std::string>();
    const std::size_t item = dtype_size(tensor.dtype);
    if (item == 0)
      throw Error(where + ": unsupported dtype '" + tensor.dtype + "' (use F32, F64, F16 or BF16)");
    if (!sh.is_array() || sh.size() > 16)
      throw Error(where + ": shape must be a list of at most 16 integers");
    for (const auto& d : sh) {
      if (!d.is_number_unsigned()) throw Error(where + ": shape entries must be integers >= 0");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX)) throw Error(where + ": dimension too large");
      tensor.shape.push_back(static_cast<int64_t>(dim));
    }
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned())
      throw Error(where + ": data_offsets must be [begin, end]");
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data.size())
      throw Error(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  "] lie outside the data section (" + std::to_string(data.size()) +
                  " bytes); the file is truncated or corrupt");
    const int64_t numel = checked_numel(tensor.shape, data.size() / item, where);
    if (end - begin != static_cast<uint64_t>(numel) * item)
      throw Error(where + ": " + std::to_string(end - begin) + " bytes of data for shape " +
                  shape_str(tensor.shape) + " of " + tensor.dtype + " (expected " +
                  std::to_string(static_cast<uint64_t>(numel) * item) + ")");
    tensor.values.resize(static_cast<std::size_t>(numel));
    for (int64_t i = 0; i < numel; ++i)
      tensor.values[static_cast<std::size_t>(i)] =
          decode(data.data() + begin + static_cast<uint64_t>(i) * item, tensor.dtype);
    ranges.push_back({begin, end, name});
    file.tensors.push_back(std::move(tensor));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end)
      throw Error("'" + source + "': tensors '" + ranges[i - 1].name + "' and '" + ranges[i].name +
                  "' overlap (data offset " + std::to_string(ranges[i].begin) + ")");
  // Data order, as the file stores it (JSON objects do not keep an order).
  std::sort(file.tensors.begin(), file.tensors.end(),
            [&](const NamedTensor& a, const NamedTensor& b) {
              const auto pos = [&](const std::string& n) {
                return std::find_if(ranges.begin(), ranges.end(),
                                    [&](const Range& r) { return r.name == n; })
                    ->begin;
              };
              return pos(a.name) < pos(b.name);
            });
  return file;
}

TensorFile read_safetensors(const std::filesystem::path& path) {
  const std::vector<uint8_t> bytes = io::read_file_bytes(path, kMaxFileBytes);
  return parse_safetensors(bytes, path.string());
}

std::vector<uint8_t> serialize_safetensors(const TensorFile& file) {
  nlohmann::ordered_json header;
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  uint64_t offset = 0;
  for (const NamedTensor& t : file.tensors) {
    const std::size_t item = dtype_size(t.dtype);
    if (t.dtype != "F32" && t.dtype != "F64")
      throw Error("tensor '" + t.name + "': polyprobe writes F32 or F64, not " + t.dtype);
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.values.size() * item}}};
    offset += t.values.size() * item;
  }
  std::string text = header.dump();
  // Pad the header with spaces so the data starts 8-byte aligned (as the reference writer does).
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::vector<uint8_t> bytes(8 + text.size() + offset);
  const uint64_t header_size = text.size();
  std::memcpy(bytes.data(), &header_size, 8);
  std::memcpy(bytes.data() + 8, text.data(), text.size());
  uint8_t* out = bytes.data() + 8 + text.size();
  for (const NamedTensor& t : file.tensors)
    for (double v : t.values) {
      if (t.dtype == "F64") {
        std::memcpy(out, &v, 8);
        out += 8;
      } else {
        const auto f = static_cast<float>(v);
        std::memcpy(out, &f, 4);
        out += 4;
      }
    }
  return bytes;
}

void write_safetensors(const std::filesystem::path& path, const TensorFile& file) {
  const std::vector<uint8_t> bytes = serialize_safetensors(file);
  io::write_file_atomically(path, [&](std::ostream& out) {
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  });
}

TensorFile model_tensors(const Model& model) {
  TensorFile file;
  file.metadata["format"] = "pt";
  const auto params = model.parameters();
  for (const ParameterEntry& entry : model.parameter_entries()) {
    NamedTensor t;
    t.name = entry.name;
    t.shape = entry.shape;
    t.dtype = model.dtype() == DType::f64 ? "F64" : "F32";
    t.values.assign(params.begin() + entry.offset, params.begin() + entry.offset + entry.size);
    file.tensors.push_back(std::move(t));
  }
  return file;
}

void assign_model_tensors(Model& model, const TensorFile& file, const std::string& source) {
  std::vector<double> params(model.parameters().begin(), model.parameters().end());
  for (const ParameterEntry& entry : model.parameter_entries()) {
    const NamedTensor* t = file.find(entry.name);
    if (t == nullptr)
      throw Error("'" + source + "' has no tensor '" + entry.name + "' (shape " +
                  shape_str(entry.shape) + ") that the model needs; was it saved from this model?");
    if (t->shape != entry.shape)
      throw Error("'" + source + "', tensor '" + entry.name + "': shape " + shape_str(t->shape) +
                  ", but the model needs " + shape_str(entry.shape));
    for (std::size_t i = 0; i < t->values.size(); ++i)
      if (!std::isfinite(t->values[i]))
        throw Error("'" + source + "', tensor '" + entry.name + "': element " + std::to_string(i) +
                    " is not finite (" + std::to_string(t->values[i]) + ")");
    std::copy(t->values.begin(), t->values.end(), params.begin() + entry.offset);
  }
  for (const NamedTensor& t : file.tensors) {
    const auto& entries = model.parameter_entries();
    if (std::none_of(entries.begin(), entries.end(),
                     [&](const ParameterEntry& e) { return e.name == t.name; }))
      throw Error("'" + source + "' has a tensor '" + t.name +
                  "' that the model does not have; the model file and the weights disagree");
  }
  std::copy(params.begin(), params.end(), model.parameters().begin());
}

void load_weights(Model& model, const std::filesystem::path& path) {
  assign_model_tensors(model, read_safetensors(path), path.string());
}

void save_weights(const Model& model, const std::filesystem::path& path) {
  write_safetensors(path, model_tensors(model));
}

}  // namespace polyprobe
