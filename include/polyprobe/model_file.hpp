// JSON model files: a model's structure as text, its weights in a safetensors file beside it.
//
// A model file is one JSON object (docs/models.md has the full reference):
//   {"polyprobe_model": 1, "input_shape": [1, 8, 8], "dtype": "float32",
//    "loss": "cross_entropy", "l2": 0,
//    "layers": [{"kind": "conv2d", "out_channels": 4, "kernel_size": 3}, {"kind": "relu"},
//               {"kind": "flatten"}, {"kind": "linear", "out_features": 10}]}
// Each layer is its kind plus that kind's attributes; layer i's parameters are named "i.weight",
// "i.bias", ... as in nn.Sequential. "loss" and "l2" are the training objective's defaults
// (optional). Reading promises a model whose layer shapes chain, or a polyprobe::Error naming
// the file and the place: the line and column of a JSON syntax error, or "layers[i] (kind)" for
// a bad layer, with what to fix. Writing (atomic) round-trips through reading.
#pragma once

#include <polyprobe/model.hpp>

#include <nlohmann/json_fwd.hpp>

#include <filesystem>
#include <string>
#include <string_view>

namespace polyprobe {

struct ModelFile {
  Model model;
  std::string loss = "cross_entropy";
  double l2 = 0.0;
};

// Parses model-file text; `source` names it in errors. Parameters are left at zero.
ModelFile parse_model_file(std::string_view text, const std::string& source,
                           const LayerFactory& factory);
ModelFile read_model_file(const std::filesystem::path& path, const LayerFactory& factory);

// The model file describing `model` (with `loss` and `l2`), keys in reading order.
nlohmann::ordered_json model_file_json(const Model& model,
                                       const std::string& loss = "cross_entropy", double l2 = 0.0);
void write_model_file(const std::filesystem::path& path, const Model& model,
                      const std::string& loss = "cross_entropy", double l2 = 0.0);

}  // namespace polyprobe
