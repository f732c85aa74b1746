// Data compiled into the library (generated at configure time from data/, see sources.cmake),
// so the default data set needs no file at run time.
#pragma once

#include <cstdint>
#include <span>

namespace polyprobe::io {

// data/digits.csv.gz, byte for byte.
std::span<const uint8_t> embedded_digits_csv_gz();

}  // namespace polyprobe::io
