// The fixed reduction chunks of a step's finish (internal), and the part of them this process
// computes when several share the step (StepShard).
//
// A range of rows [origin, origin + rows) of a step's P particles (all of them, or one block) is
// cut where the step's particle index is a multiple of StepShard::kGrain: chunk c covers global
// chunk origin / kGrain + c intersected with the range. Every reduction of the finish writes one
// partial per chunk and adds them in chunk order, so its bits depend on neither the thread count
// nor the process count; with a shard, a process computes the chunks of its own particles and
// share() makes every process's partials everyone's before they are added.
#pragma once

#include "step_threads.hpp"

#include <polyprobe/step_shard.hpp>

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace polyprobe::detail {

class RowChunks {
 public:
  // `shard` may be null (this process computes every chunk); it must outlive the object.
  // `bounds` (empty: shard->bounds()) are the processes' particles to cut by.
  RowChunks(int64_t origin, int64_t rows, StepShard* shard, std::span<const int64_t> bounds = {});

  int64_t count() const { return count_; }
  // Rows of chunk c, relative to the range.
  int64_t begin(int64_t c) const;
  int64_t end(int64_t c) const;
  // This process's chunks [own_first(), own_last()) and rows [own_begin(), own_end()).
  int64_t own_first() const { return own_first_; }
  int64_t own_last() const { return own_last_; }
  int64_t own_begin() const { return own_first_ < own_last_ ? begin(own_first_) : 0; }
  int64_t own_end() const { return own_first_ < own_last_ ? end(own_last_ - 1) : 0; }
  bool sharded() const { return shard_ != nullptr; }

  // Calls body(chunk, begin, end) for each of this process's chunks (rows relative to the
  // range), several chunks to a task on `threads`.
  void for_own(const StepThreads& threads,
               const std::function<void(int64_t chunk, int64_t begin, int64_t end)>& body) const;
  // [count() * width] partials, chunk c at c * width: every process's own chunks become
  // everyone's (nothing to do without a shard).
  void share_chunks(std::span<double> partials, int64_t width, const char* what) const;
  // [rows * width] values of the range's rows, the same way.
  void share_rows(std::span<double> values, int64_t width, const char* what) const;

 private:
  void share(std::span<double> values, const std::vector<int64_t>& offsets, int64_t width,
             const char* what) const;

  int64_t origin_, rows_, first_global_, count_;
  StepShard* shard_;
  int64_t own_first_ = 0, own_last_ = 0;
  std::vector<int64_t> chunk_offsets_;  // [processes + 1]: where each one's chunks begin
  std::vector<int64_t> row_offsets_;    // [processes + 1]: where each one's rows begin
  mutable std::vector<int64_t> scaled_;
};

}  // namespace polyprobe::detail
