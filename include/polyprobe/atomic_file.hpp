// Writing a user's file so that it is never left half-written: into a temporary file in the
// same folder, then renamed over the target. polyprobe writes every output file this way
// (weights, model files, checkpoints, reports, benchmark records).
#pragma once

#include <filesystem>
#include <functional>
#include <iosfwd>
#include <string>

namespace polyprobe::io {

// Writes `path` through `write`, atomically. On any failure (an exception from `write`, a
// full disk, a folder that does not exist) the temporary file is removed, `path` is untouched,
// and a polyprobe::Error naming the file is thrown. `path` must pass check_output_file; a
// symbolic link to a regular file is followed (the link stays), and a replaced file keeps its
// permission bits.
void write_file_atomically(const std::filesystem::path& path,
                           const std::function<void(std::ostream&)>& write);

// Throws a polyprobe::Error naming `what` ("--save file") and `path` unless `path` may be
// written: a non-empty name of a file that does not exist yet, or of a writable regular file
// that is not a shared library this process has loaded (a plugin in use). Devices, FIFOs,
// sockets, folders and read-only files are refused, never replaced.
void check_output_file(const std::filesystem::path& path, const std::string& what);

// An exclusive claim on an output file for as long as the object lives, so that two processes
// never write the same file at once: a lock file ".NAME.lock" beside `path`, held with flock()
// and removed on destruction. Throws a polyprobe::Error naming `what` and `path` when another
// process holds it.
class OutputLock {
 public:
  OutputLock(const std::filesystem::path& path, const std::string& what);
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

 private:
  std::filesystem::path lock_path_;
  int fd_ = -1;
};

}  // namespace polyprobe::io
