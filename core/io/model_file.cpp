#include <polyprobe/error.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model_file.hpp>

#include "io/file_util.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <ostream>

namespace polyprobe {
namespace {

constexpr uint64_t kMaxModelFileBytes = 16 << 20;
constexpr int kFormatVersion = 1;
// Bounds that keep every size product far from int64 overflow and allocations sane: no
// attribute integer above 2^24, no activation above 2^30 values per sample, no model above
// 2^28 parameters (2 GiB of float64).
constexpr int64_t kMaxAttributeInteger = int64_t{1} << 24;
constexpr int64_t kMaxSampleValues = int64_t{1} << 30;
constexpr int64_t kMaxParameters = int64_t{1} << 28;

// Refuses integers too large for any layer attribute, anywhere in `value`.
void check_attribute_magnitudes(const nlohmann::json& value, const std::string& where) {
  if (value.is_number_integer() &&
      std::abs(value.get<double>()) > static_cast<double>(kMaxAttributeInteger))
    throw Error(where + ": attribute value " + value.dump() + " is larger than 2^24");
  if (value.is_structured())
    for (const auto& item : value) check_attribute_magnitudes(item, where);
}

// Product of `dims`, or -1 when it exceeds `limit` (or a dim is negative).
int64_t bounded_product(const std::vector<int64_t>& dims, int64_t limit) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || (d != 0 && n > limit / d)) return -1;
    n *= d;
  }
  return n;
}

// "line L, column C" of byte offset `position` (1-based, as editors count).
std::string text_position(std::string_view text, std::size_t position) {
  position = std::min(position, text.size());
  const auto line =
      1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(position), '\n');
  const std::size_t line_start = text.rfind('\n', position == 0 ? 0 : position - 1);
  const std::size_t column =
      line_start == std::string_view::npos ? position : position - line_start - 1;
  return "line " + std::to_string(line) + ", column " + std::to_string(column + 1);
}

Shape parse_input_shape(const nlohmann::json& value, const std::string& source) {
  const auto fail = [&]() {
    return Error("'" + source + "': input_shape must be a list of 1 to 8 positive integers, " +
                 "e.g. [64] or [1, 28, 28], got " + value.dump());
  };
  if (!value.is_array() || value.empty() || value.size() > 8) throw fail();
  Shape shape;
  int64_t numel = 1;
  for (const auto& d : value) {
    if (!d.is_number_integer() || d.get<int64_t>() <= 0 || d.get<int64_t>() > (int64_t{1} << 30))
      throw fail();
    numel *= d.get<int64_t>();
    if (numel > (int64_t{1} << 30)) throw fail();
    shape.dims.push_back(d.get<int64_t>());
  }
  return shape;
}

}  // namespace

ModelFile parse_model_file(std::string_view text, const std::string& source,
                           const LayerFactory& factory) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw Error("'" + source + "': JSON syntax error at " +
                text_position(text, e.byte == 0 ? 0 : e.byte - 1) + ": " + e.what());
  } catch (const nlohmann::json::exception& e) {
    throw Error("'" + source + "': invalid JSON: " + e.what());
  }
  if (!doc.is_object()) throw Error("'" + source + "': a model file is a JSON object");
  static const char* const kKeys[] = {"polyprobe_model", "input_shape", "dtype", "loss", "l2",
                                      "layers",          "description"};
  for (const auto& [key, value] : doc.items())
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      throw Error(
          "'" + source + "': unknown key '" + key +
          "' (allowed: polyprobe_model, input_shape, dtype, loss, l2, layers, description)");
  if (doc.contains("polyprobe_model") && (!doc["polyprobe_model"].is_number_integer() ||
                                          doc["polyprobe_model"].get<int64_t>() != kFormatVersion))
    throw Error("'" + source + "': polyprobe_model must be 1 (the only format version)");
  if (!doc.contains("input_shape")) throw Error("'" + source + "': missing input_shape");
  const Shape input = parse_input_shape(doc["input_shape"], source);
  DType dtype = DType::f32;
  std::string loss = "cross_entropy";
  double l2 = 0.0;
  try {
    if (doc.contains("dtype")) dtype = parse_dtype(doc["dtype"].get<std::string>());
    if (doc.contains("loss")) loss = doc["loss"].get<std::string>();
    if (doc.contains("l2")) l2 = doc["l2"].get<double>();
    make_loss(loss, l2);  // validates both
  } catch (const nlohmann::json::exception&) {
    throw Error("'" + source + "': dtype and loss must be strings and l2 a number");
  } catch (const Error& e) {
    throw Error("'" + source + "': " + e.what());
  }
  if (!doc.contains("layers") || !doc["layers"].is_array() || doc["layers"].empty())
    throw Error("'" + source + "': layers must be a non-empty list of {\"kind\": ..., attributes}");
  if (doc["layers"].size() > 4096) throw Error("'" + source + "': more than 4096 layers");
  ModelFile result{Model(input, dtype), loss, l2};
  std::size_t index = 0;
  for (const nlohmann::json& spec : doc["layers"]) {
    const std::string where = "'" + source + "', layers[" + std::to_string(index) + "]";
    if (!spec.is_object() || !spec.contains("kind") || !spec["kind"].is_string())
      throw Error(where + ": each layer is an object with a string \"kind\"");
    const std::string kind = spec["kind"].get<std::string>();
    nlohmann::json attrs = spec;
    attrs.erase("kind");
    check_attribute_magnitudes(attrs, where + " (" + kind + ")");
    try {
      const auto layer = factory.create(kind, attrs, result.model.output_shape());
      if (bounded_product(layer->output_shape().dims, kMaxSampleValues) < 1)
        throw Error("output shape " + layer->output_shape().str() +
                    " is empty or has more than 2^30 values");
      int64_t count = 0;
      for (const ParamSpec& p : layer->parameters()) {
        const int64_t n = bounded_product(p.shape, kMaxParameters);
        if (n < 0 || (count += n) > kMaxParameters - result.model.num_parameters())
          throw Error("the model would have more than 2^28 parameters");
      }
      result.model.add(layer);
    } catch (const Error& e) {
      throw Error(where + " (" + kind + "): " + e.what());
    } catch (const std::exception& e) {  // a plugin's layer may throw anything
      throw Error(where + " (" + kind + "): " + e.what());
    }
    ++index;
  }
  return result;
}

ModelFile read_model_file(const std::filesystem::path& path, const LayerFactory& factory) {
  const std::vector<uint8_t> bytes = io::read_file_bytes(path, kMaxModelFileBytes);
  return parse_model_file(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path.string(),
      factory);
}

nlohmann::ordered_json model_file_json(const Model& model, const std::string& loss, double l2) {
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < model.num_layers(); ++i) {
    nlohmann::ordered_json layer = {{"kind", model.layer(i).kind()}};
    const nlohmann::json attributes = model.layer(i).attributes();
    for (const auto& [key, value] : attributes.items()) layer[key] = value;
    layers.push_back(layer);
  }
  return {{"polyprobe_model", kFormatVersion},
          {"input_shape", model.input_shape().dims},
          {"dtype", model.dtype() == DType::f64 ? "float64" : "float32"},
          {"loss", loss},
          {"l2", l2},
          {"layers", layers}};
}

void write_model_file(const std::filesystem::path& path, const Model& model,
                      const std::string& loss, double l2) {
  const nlohmann::ordered_json doc = model_file_json(model, loss, l2);
  io::write_file_atomically(path, [&](std::ostream& out) { out << doc.dump(2) << "\n"; });
}

}  // namespace polyprobe
