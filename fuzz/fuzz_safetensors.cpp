// libFuzzer target: safetensors files must parse or throw polyprobe::Error, never read out of
// bounds; what parses must serialise and parse back to the same tensors.
#include <polyprobe/error.hpp>
#include <polyprobe/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    polyprobe::TensorFile file = polyprobe::parse_safetensors({data, size}, "fuzz.safetensors");
    for (auto& t : file.tensors) t.dtype = "F64";  // exact round trip
    const std::vector<uint8_t> bytes = polyprobe::serialize_safetensors(file);
    const polyprobe::TensorFile back = polyprobe::parse_safetensors(bytes, "round trip");
    if (back.tensors.size() != file.tensors.size()) __builtin_trap();
    for (std::size_t i = 0; i < back.tensors.size(); ++i)
      if (back.tensors[i].shape != file.tensors[i].shape ||
          std::memcmp(back.tensors[i].values.data(), file.tensors[i].values.data(),
                      8 * back.tensors[i].values.size()) != 0)
        __builtin_trap();
  } catch (const polyprobe::Error&) {
  }
  return 0;
}
