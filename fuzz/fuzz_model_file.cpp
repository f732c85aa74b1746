// libFuzzer target: JSON model files. A file that parses must also run forward (on zeros) when
// it is small enough, so layer constructors that accept bad attributes are caught too.
#include <polyprobe/error.hpp>
#include <polyprobe/model_file.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const polyprobe::LayerFactory factory = polyprobe::LayerFactory::with_builtins();
  try {
    polyprobe::ModelFile file = polyprobe::parse_model_file(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json", factory);
    const polyprobe::Model& model = file.model;
    int64_t widest = model.input_shape().numel();
    for (std::size_t i = 0; i < model.num_layers(); ++i)
      widest = std::max(widest, model.layer(i).output_shape().numel());
    if (widest <= 4096 && model.num_parameters() <= 200000 && model.num_layers() <= 16) {
      const polyprobe::Matrix<float> x =
          polyprobe::Matrix<float>::Zero(2, model.input_shape().numel());
      const polyprobe::Matrix<float> y = model.forward<float>(x);
      if (y.cols() != model.output_shape().numel()) __builtin_trap();
    }
  } catch (const polyprobe::Error&) {
  }
  return 0;
}
