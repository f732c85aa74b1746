// Safetensors: the weight files polyprobe shares with PyTorch.
//
// A safetensors file is an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw little-endian data. polyprobe reads F64,
// F32, F16 and BF16 tensors (into float64) and writes F32 or F64 (the model's dtype), naming
// tensors as nn.Sequential does ("0.weight", "0.bias", "2.weight"), so weights trained here load
// with `safetensors.torch.load_file` + `model.load_state_dict`, and the other way round. The
// reader trusts nothing: a truncated file, a header length or tensor range beyond the file,
// overlapping ranges, a size that disagrees with the shape, an unknown dtype or a NaN where a
// model expects a weight is a polyprobe::Error naming the file and the tensor or byte offset.
// Writes are atomic (temporary file, then rename).
#pragma once

#include <polyprobe/tensor.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace polyprobe {

class Model;

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype = "F32";  // as stored: "F64", "F32", "F16" or "BF16"
  std::vector<double> values;
};

struct TensorFile {
  std::vector<NamedTensor> tensors;  // in file order of their data
  std::map<std::string, std::string> metadata;
  // The tensor called `name`, or null.
  const NamedTensor* find(const std::string& name) const;
};

// Parses a whole safetensors file held in memory; `source` names it in errors.
TensorFile parse_safetensors(std::span<const uint8_t> bytes, const std::string& source);
TensorFile read_safetensors(const std::filesystem::path& path);
// The file's bytes; each tensor is stored as its `dtype` ("F32" or "F64").
std::vector<uint8_t> serialize_safetensors(const TensorFile& file);
void write_safetensors(const std::filesystem::path& path, const TensorFile& file);

// The model's parameters as named tensors in its dtype (PyTorch names and shapes).
TensorFile model_tensors(const Model& model);
// Sets the model's parameters from `file`: every parameter must be present with its exact
// shape and finite values, and no tensor may be left over. Nothing changes on error.
void assign_model_tensors(Model& model, const TensorFile& file, const std::string& source);

void load_weights(Model& model, const std::filesystem::path& path);
void save_weights(const Model& model, const std::filesystem::path& path);

}  // namespace polyprobe
