// libFuzzer target: the CSV data parser must accept or throw polyprobe::Error, never crash.
#include <polyprobe/data.hpp>
#include <polyprobe/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const polyprobe::Dataset d = polyprobe::parse_csv(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.csv");
    if (d.size() > 0 && d.labels.size() != static_cast<size_t>(d.size())) __builtin_trap();
  } catch (const polyprobe::Error&) {
  }
  return 0;
}
