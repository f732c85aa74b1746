#include "io/file_util.hpp"

#include <polyprobe/error.hpp>

#include <zlib.h>

#include <unistd.h>
#include <fstream>
#include <limits>
#include <system_error>

namespace polyprobe::io {
namespace fs = std::filesystem;

std::vector<uint8_t> read_file_bytes(const fs::path& path, uint64_t max_bytes) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error("'" + path.string() + "' is a directory, not a file");
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

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write) {
  const fs::path target = path.empty() ? path : fs::absolute(path);
  if (target.empty()) throw Error("cannot write to an empty file name");
  // Hidden, in the same folder (so the rename stays on one file system), unique per process.
  std::string name = ".";
  name.append(target.filename().string()).append(".tmp.").append(std::to_string(::getpid()));
  const fs::path temporary = target.parent_path() / name;
  std::error_code ec;
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
