// File helpers shared by the readers and writers of core/io and core/train: bounded whole-file
// reads (gzip-aware), and atomic writes (polyprobe/atomic_file.hpp: a temporary file renamed
// over the target, so an interrupted writer never leaves a partial file behind).
#pragma once

#include <polyprobe/atomic_file.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace polyprobe::io {

// The bytes of `path`; throws polyprobe::Error naming the file when it cannot be read or is
// larger than `max_bytes`.
std::vector<uint8_t> read_file_bytes(const std::filesystem::path& path, uint64_t max_bytes);

// The bytes of `path`, gunzipped when they start with the gzip magic; throws when the file or
// its decompressed content exceeds `max_bytes` or the gzip stream is corrupt or truncated.
std::vector<uint8_t> read_maybe_gzip(const std::filesystem::path& path, uint64_t max_bytes);
// The same for bytes already in memory; `source` names them in errors.
std::vector<uint8_t> gunzip_if_needed(std::vector<uint8_t> bytes, const std::string& source,
                                      uint64_t max_bytes);

}  // namespace polyprobe::io
