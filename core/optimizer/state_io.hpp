// Exact text serialisation of optimizer state.
//
// Checkpoints must resume bit for bit, so every double is written as the hexadecimal bit
// pattern of its IEEE value (NaN and infinities included) and every field is preceded by its
// name, which load checks: a checkpoint from another configuration fails with the field it
// disagrees on instead of resuming wrongly.
#pragma once

#include <polyprobe/error.hpp>

#include <bit>
#include <cstdint>
#include <istream>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace polyprobe::state_io {

inline void put_tag(std::ostream& out, const std::string& tag) { out << tag << ' '; }

inline void expect_tag(std::istream& in, const std::string& tag) {
  std::string got;
  if (!(in >> got) || got != tag)
    throw Error("optimizer checkpoint: expected field '" + tag + "' but found '" + got +
                "'; the checkpoint is corrupt or was written by another configuration");
}

inline void put(std::ostream& out, const std::string& tag, double value) {
  put_tag(out, tag);
  out << std::hex << std::bit_cast<uint64_t>(value) << std::dec << '\n';
}

inline void get(std::istream& in, const std::string& tag, double& value) {
  expect_tag(in, tag);
  uint64_t bits = 0;
  if (!(in >> std::hex >> bits >> std::dec))
    throw Error("optimizer checkpoint: field '" + tag + "' is not a number");
  value = std::bit_cast<double>(bits);
}

template <class I>
requires std::is_integral_v<I>
inline void put(std::ostream& out, const std::string& tag, I value) {
  put_tag(out, tag);
  out << static_cast<int64_t>(value) << '\n';
}

template <class I>
requires std::is_integral_v<I>
inline void get(std::istream& in, const std::string& tag, I& value) {
  expect_tag(in, tag);
  int64_t v = 0;
  if (!(in >> v)) throw Error("optimizer checkpoint: field '" + tag + "' is not an integer");
  value = static_cast<I>(v);
}

inline void put(std::ostream& out, const std::string& tag, const std::vector<double>& values) {
  put_tag(out, tag);
  out << values.size() << std::hex;
  for (double v : values) out << ' ' << std::bit_cast<uint64_t>(v);
  out << std::dec << '\n';
}

inline void get(std::istream& in, const std::string& tag, std::vector<double>& values) {
  expect_tag(in, tag);
  std::size_t count = 0;
  if (!(in >> count)) throw Error("optimizer checkpoint: field '" + tag + "' has no size");
  values.resize(count);
  in >> std::hex;
  for (double& v : values) {
    uint64_t bits = 0;
    if (!(in >> bits)) throw Error("optimizer checkpoint: field '" + tag + "' is truncated");
    v = std::bit_cast<double>(bits);
  }
  in >> std::dec;
}

// std::mt19937_64 writes and reads its whole state exactly with << and >>.
inline void put(std::ostream& out, const std::string& tag, const std::mt19937_64& rng) {
  put_tag(out, tag);
  out << rng << '\n';
}

inline void get(std::istream& in, const std::string& tag, std::mt19937_64& rng) {
  expect_tag(in, tag);
  if (!(in >> rng)) throw Error("optimizer checkpoint: field '" + tag + "' is not an RNG state");
}

}  // namespace polyprobe::state_io
