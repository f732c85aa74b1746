// libFuzzer target: the IDX parser (after the gzip layer, which every reader goes through)
// must accept or throw polyprobe::Error, never crash or allocate without bound.
#include <polyprobe/data.hpp>
#include <polyprobe/error.hpp>

#include "io/file_util.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const std::vector<uint8_t> bytes = polyprobe::io::gunzip_if_needed(
        std::vector<uint8_t>(data, data + size), "fuzz.idx", 1 << 24);
    const polyprobe::IdxArray array = polyprobe::parse_idx(bytes, "fuzz.idx");
    size_t count = 1;
    for (int64_t d : array.dims) count *= static_cast<size_t>(d);
    if (count != array.values.size()) __builtin_trap();
  } catch (const polyprobe::Error&) {
  }
  return 0;
}
