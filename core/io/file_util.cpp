#include "io/file_util.hpp"

#include <polyprobe/error.hpp>

#include <zlib.h>

#include <fcntl.h>
#include <link.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <system_error>

namespace polyprobe::io {
namespace fs = std::filesystem;

std::vector<uint8_t> read_file_bytes(const fs::path& path, uint64_t max_bytes) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error("'" + path.string() + "' is a directory, not a file");
  // A FIFO would block the open until a writer came; a device has no size to check.
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    throw Error("'" + path.string() + "' is not a regular file (a device, FIFO or socket)");
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error("cannot open '" + path.string() + "' (does it exist and is it readable?)");
  file.seekg(0, std::ios::end);
  const std::streamoff size = file.tellg();
  if (size < 0) throw Error("cannot determine the size of '" + path.string() + "'");
  if (static_cast<uint64_t>(size) > max_bytes)
    throw Error("'" + path.string() + "' is " + std::to_string(size) +
                " bytes, more than the limit of " + std::to_string(max_bytes));
  file.seekg(0, std::ios::beg);
  std::vector<uint8_t> bytes(static_cast<std::size_t>(size));
  file.read(reinterpret_cast<char*>(bytes.data()), size);
  if (file.gcount() != size) throw Error("could not read all of '" + path.string() + "'");
  return bytes;
}

std::vector<uint8_t> gunzip_if_needed(std::vector<uint8_t> bytes, const std::string& source,
                                      uint64_t max_bytes) {
  if (bytes.size() < 2 || bytes[0] != 0x1f || bytes[1] != 0x8b) return bytes;
  z_stream stream{};
  if (inflateInit2(&stream, 16 + MAX_WBITS) != Z_OK)
    throw Error("cannot initialise zlib to read '" + source + "'");
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 16);
  stream.next_in = bytes.data();
  stream.avail_in =
      static_cast<uInt>(std::min<std::size_t>(bytes.size(), std::numeric_limits<uInt>::max()));
  int status = Z_OK;
  while (status != Z_STREAM_END) {
    stream.next_out = chunk.data();
    stream.avail_out = static_cast<uInt>(chunk.size());
    status = inflate(&stream, Z_NO_FLUSH);
    if (status != Z_OK && status != Z_STREAM_END) {
      const std::string why =
          status == Z_BUF_ERROR ? "it is truncated" : (stream.msg ? stream.msg : "corrupt data");
      inflateEnd(&stream);
      throw Error("'" + source + "' is not a valid gzip file: " + why + " (at compressed byte " +
                  std::to_string(stream.total_in) + ")");
    }
    out.insert(out.end(), chunk.data(), chunk.data() + (chunk.size() - stream.avail_out));
    if (out.size() > max_bytes) {
      inflateEnd(&stream);
      throw Error("'" + source + "' decompresses to more than the limit of " +
                  std::to_string(max_bytes) + " bytes");
    }
  }
  inflateEnd(&stream);
  return out;
}

std::vector<uint8_t> read_maybe_gzip(const fs::path& path, uint64_t max_bytes) {
  return gunzip_if_needed(read_file_bytes(path, max_bytes), path.string(), max_bytes);
}

namespace {

// What a file that is not a regular file is, in words.
std::string file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// True when the file with this device and inode is a shared object mapped into this process
// (the core library, a plugin, a system library).
bool is_loaded_library(dev_t device, ino_t inode) {
  struct Wanted {
    dev_t device;
    ino_t inode;
    bool found;
  } wanted{device, inode, false};
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        auto* w = static_cast<Wanted*>(data);
        struct stat st {};
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0' &&
            ::stat(info->dlpi_name, &st) == 0 && st.st_dev == w->device && st.st_ino == w->inode)
          w->found = true;
        return w->found ? 1 : 0;
      },
      &wanted);
  if (wanted.found) return true;
  // The executable itself (dl_iterate_phdr names it "").
  struct stat self {};
  return ::stat("/proc/self/exe", &self) == 0 && self.st_dev == device && self.st_ino == inode;
}

}  // namespace

void check_output_file(const fs::path& path, const std::string& what) {
  if (path.empty())
    throw Error("the " + what + " name is empty: give a file name (or leave the option out)");
  const std::string name = "the " + what + " '" + path.string() + "'";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;  // a new file (its folder is checked when it is written)
    throw Error("cannot write " + name + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode))
    throw Error("refusing to write " + name + ": it is " + file_type_name(st.st_mode) +
                "; polyprobe writes only regular files (or creates new ones): choose a file "
                "name");
  if ((st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0 || ::access(path.c_str(), W_OK) != 0)
    throw Error("refusing to write " + name +
                ": it is read-only; make it writable or choose another file name");
  if (is_loaded_library(st.st_dev, st.st_ino))
    throw Error("refusing to write " + name +
                ": it is a shared library in use by this process (a plugin or polyprobe "
                "itself); choose another file name");
}

OutputLock::OutputLock(const fs::path& path, const std::string& what) {
  const fs::path target = fs::absolute(path);
  std::string name = ".";
  name.append(target.filename().string()).append(".lock");
  lock_path_ = target.parent_path() / name;
  // A lock file removed by its previous holder between our open and our flock would leave us
  // holding a lock nobody else sees: retry until the locked file is the one at the path.
  for (int attempt = 0; attempt < 10; ++attempt) {
    fd_ = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd_ < 0)
      throw Error("cannot create the lock file '" + lock_path_.string() + "' for the " + what +
                  " '" + path.string() + "': " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      ::close(fd_);
      fd_ = -1;
      if (error == EWOULDBLOCK)
        throw Error("another process is writing the " + what + " '" + path.string() +
                    "' (it holds '" + lock_path_.string() +
                    "'): wait for it to finish or choose another file name");
      throw Error("cannot lock '" + lock_path_.string() + "': " + std::strerror(error));
    }
    struct stat held {
    }, current{};
    if (::fstat(fd_, &held) == 0 && ::stat(lock_path_.c_str(), &current) == 0 &&
        held.st_dev == current.st_dev && held.st_ino == current.st_ino)
      return;
    ::close(fd_);
    fd_ = -1;
  }
  throw Error("cannot lock '" + lock_path_.string() + "': it keeps being replaced");
}

OutputLock::~OutputLock() {
  if (fd_ < 0) return;
  ::unlink(lock_path_.c_str());  // while still held, so no one locks the removed file
  ::close(fd_);
}

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write) {
  check_output_file(path, "file");
  // A link to a regular file is written through: the file it names is replaced, the link
  // stays a link.
  std::error_code ec;
  const fs::path target =
      fs::is_symlink(path, ec) ? fs::canonical(path, ec) : fs::absolute(path, ec);
  if (target.empty()) throw Error("cannot resolve the file name '" + path.string() + "'");
  struct stat existing {};
  const bool replacing = ::stat(target.c_str(), &existing) == 0;
  // Hidden, in the same folder (so the rename stays on one file system), unique per process.
  std::string name = ".";
  name.append(target.filename().string()).append(".tmp.").append(std::to_string(::getpid()));
  const fs::path temporary = target.parent_path() / name;
  try {
    {
      std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
      if (!file)
        throw Error("cannot write '" + path.string() + "': the folder '" +
                    target.parent_path().string() + "' does not exist or is not writable");
      write(file);
      file.flush();
      if (!file) throw Error("writing '" + path.string() + "' failed (disk full?)");
    }
    // The replaced file's permissions carry over (a file shared with a group stays shared).
    if (replacing) ::chmod(temporary.c_str(), existing.st_mode & 07777);
    fs::rename(temporary, target, ec);
    if (ec)
      throw Error("cannot rename '" + temporary.string() + "' to '" + target.string() +
                  "': " + ec.message());
  } catch (...) {
    fs::remove(temporary, ec);
    throw;
  }
}

}  // namespace polyprobe::io
