#include "train/checkpoint.hpp"

#include <polyprobe/error.hpp>

#include "io/file_util.hpp"

#include <nlohmann/json.hpp>

#include <cstring>
#include <ostream>

namespace polyprobe::train_detail {
namespace {

constexpr char kMagic[] = "polyprobe-checkpoint 1\n";
constexpr uint64_t kMaxCheckpointBytes = uint64_t{64} << 30;

void put_block(std::ostream& out, const void* data, uint64_t bytes) {
  out.write(reinterpret_cast<const char*>(&bytes), 8);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

// Reads length-prefixed blocks from a byte buffer, refusing to run past its end.
class BlockReader {
 public:
  BlockReader(const std::vector<uint8_t>& bytes, std::size_t offset, std::string source)
      : bytes_(bytes), offset_(offset), source_(std::move(source)) {}
  std::string next() {
    uint64_t size = 0;
    if (bytes_.size() - offset_ < 8) fail();
    std::memcpy(&size, bytes_.data() + offset_, 8);
    offset_ += 8;
    if (size > bytes_.size() - offset_) fail();
    std::string block(reinterpret_cast<const char*>(bytes_.data() + offset_), size);
    offset_ += size;
    return block;
  }
  std::vector<double> doubles() {
    const std::string block = next();
    if (block.size() % 8 != 0) fail();
    std::vector<double> values(block.size() / 8);
    std::memcpy(values.data(), block.data(), block.size());
    return values;
  }

 private:
  [[noreturn]] void fail() const {
    throw Error("checkpoint '" + source_ + "' is truncated or damaged (at byte " +
                std::to_string(offset_) + "); delete it or train without --resume");
  }
  const std::vector<uint8_t>& bytes_;
  std::size_t offset_;
  std::string source_;
};

}  // namespace

void write_checkpoint(const std::filesystem::path& path, const Checkpoint& c) {
  const nlohmann::json meta = {{"step", c.step},
                               {"epoch", c.epoch},
                               {"position", c.position},
                               {"epochs_completed", c.epochs_completed},
                               {"epochs_without_improvement", c.epochs_without_improvement},
                               {"best_epoch", c.best_epoch},
                               {"best_step", c.best_step},
                               {"validations", c.validations},
                               {"best_accuracy", c.best_accuracy},
                               {"best_loss", c.best_loss},
                               {"seconds", c.seconds},
                               {"evaluations", c.evaluations},
                               {"seed", c.seed},
                               {"batch_size", c.batch_size}};
  const std::string text = meta.dump();
  io::write_file_atomically(path, [&](std::ostream& out) {
    out.write(kMagic, sizeof(kMagic) - 1);
    put_block(out, text.data(), text.size());
    put_block(out, c.parameters.data(), c.parameters.size() * 8);
    put_block(out, c.best_parameters.data(), c.best_parameters.size() * 8);
    put_block(out, c.optimizer_state.data(), c.optimizer_state.size());
  });
}

Checkpoint read_checkpoint(const std::filesystem::path& path) {
  const std::vector<uint8_t> bytes = io::read_file_bytes(path, kMaxCheckpointBytes);
  const std::size_t magic = sizeof(kMagic) - 1;
  if (bytes.size() < magic || std::memcmp(bytes.data(), kMagic, magic) != 0)
    throw Error("'" + path.string() + "' is not a polyprobe checkpoint (bad magic at offset 0)");
  BlockReader reader(bytes, magic, path.string());
  Checkpoint c;
  try {
    const nlohmann::json meta = nlohmann::json::parse(reader.next());
    c.step = meta.at("step");
    c.epoch = meta.at("epoch");
    c.position = meta.at("position");
    c.epochs_completed = meta.at("epochs_completed");
    c.epochs_without_improvement = meta.at("epochs_without_improvement");
    c.best_epoch = meta.at("best_epoch");
    // Absent from checkpoints written before validate_every existed.
    c.best_step = meta.value("best_step", int64_t{-1});
    c.validations = meta.value("validations", c.epochs_completed);
    c.best_accuracy = meta.at("best_accuracy");
    c.best_loss = meta.at("best_loss");
    c.seconds = meta.at("seconds");
    c.evaluations = meta.at("evaluations");
    c.seed = meta.at("seed");
    c.batch_size = meta.at("batch_size");
  } catch (const nlohmann::json::exception& e) {
    throw Error("checkpoint '" + path.string() + "': bad metadata: " + e.what());
  }
  c.parameters = reader.doubles();
  c.best_parameters = reader.doubles();
  c.optimizer_state = reader.next();
  return c;
}

}  // namespace polyprobe::train_detail
