// Writing a user's file so that it is never left half-written: into a temporary file in the
// same folder, then renamed over the target. polyprobe writes every output file this way
// (weights, model files, checkpoints, reports, benchmark records).
#pragma once

#include <filesystem>
#include <functional>
#include <iosfwd>

namespace polyprobe::io {

// Writes `path` through `write`, atomically. On any failure (an exception from `write`, a
// full disk, a folder that does not exist) the temporary file is removed, `path` is untouched,
// and a polyprobe::Error naming the file is thrown.
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(std::ostream&)>& write);

}  // namespace polyprobe::io
