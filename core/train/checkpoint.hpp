// The training checkpoint: one binary file holding the loop's position, the current and best
// parameters and the optimizer's exact state. Written atomically (io::write_file_atomically);
// read back with every size checked, so a foreign or damaged file is an Error, not a crash.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace polyprobe::train_detail {

struct Checkpoint {
  int64_t step = 0;
  int64_t epoch = 0;     // epoch of the next step
  int64_t position = 0;  // rows of that epoch already served
  int64_t epochs_completed = 0;
  int64_t epochs_without_improvement = 0;  // validations without improvement
  int64_t best_epoch = -1;
  int64_t best_step = -1;
  int64_t validations = 0;
  double best_accuracy = 0, best_loss = 0;
  double seconds = 0;
  int64_t evaluations = 0;
  uint64_t seed = 0;
  int64_t batch_size = 0;
  std::vector<double> parameters, best_parameters;
  std::string optimizer_state;
};

void write_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint);
Checkpoint read_checkpoint(const std::filesystem::path& path);

}  // namespace polyprobe::train_detail
