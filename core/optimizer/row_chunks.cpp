// The fixed reduction chunks of a step's finish (row_chunks.hpp).
#include "row_chunks.hpp"

#include <polyprobe/error.hpp>

#include <algorithm>
#include <string>

namespace polyprobe::detail {
namespace {
constexpr int64_t kGrain = StepShard::kGrain;
// Chunks to a task of for_own(): 1024 rows, as cheap per-row work wants.
constexpr int64_t kChunksPerTask = 16;
}  // namespace

RowChunks::RowChunks(int64_t origin, int64_t rows, StepShard* shard,
                     std::span<const int64_t> bounds)
    : origin_(origin),
      rows_(rows),
      first_global_(origin / kGrain),
      count_(rows > 0 ? (origin + rows + kGrain - 1) / kGrain - origin / kGrain : 0),
      shard_(shard),
      own_last_(count_) {
  if (shard_ == nullptr) return;
  if (bounds.empty()) bounds = shard_->bounds();
  const int index = shard_->index();
  if (bounds.size() < 2 || index < 0 || static_cast<std::size_t>(index) + 1 >= bounds.size())
    throw Error("step shard: process " + std::to_string(index) + " of " +
                std::to_string(bounds.size()) + " bounds");
  const auto position = [&](int64_t s) -> int64_t {
    if (s <= origin_) return 0;
    if (s >= origin_ + rows_) return count_;
    if (s % kGrain != 0)
      throw Error("step shard: bound " + std::to_string(s) + " is not a multiple of " +
                  std::to_string(kGrain) + " particles");
    return s / kGrain - first_global_;
  };
  for (const int64_t s : bounds) {
    const int64_t c = position(s);
    chunk_offsets_.push_back(c);
    row_offsets_.push_back(c == count_ ? rows_ : begin(c));
  }
  own_first_ = chunk_offsets_[static_cast<std::size_t>(index)];
  own_last_ = chunk_offsets_[static_cast<std::size_t>(index) + 1];
}

int64_t RowChunks::begin(int64_t c) const {
  return std::max(origin_, (first_global_ + c) * kGrain) - origin_;
}

int64_t RowChunks::end(int64_t c) const {
  return std::min(origin_ + rows_, (first_global_ + c + 1) * kGrain) - origin_;
}

void RowChunks::for_own(
    const StepThreads& threads,
    const std::function<void(int64_t chunk, int64_t begin, int64_t end)>& body) const {
  threads.for_chunks(own_last_ - own_first_, kChunksPerTask, [&](int64_t, int64_t b, int64_t e) {
    for (int64_t c = own_first_ + b; c < own_first_ + e; ++c) body(c, begin(c), end(c));
  });
}

void RowChunks::share_chunks(std::span<double> partials, int64_t width, const char* what) const {
  if (shard_ != nullptr) share(partials, chunk_offsets_, width, what);
}

void RowChunks::share_rows(std::span<double> values, int64_t width, const char* what) const {
  if (shard_ != nullptr) share(values, row_offsets_, width, what);
}

void RowChunks::share(std::span<double> values, const std::vector<int64_t>& offsets, int64_t width,
                      const char* what) const {
  scaled_.resize(offsets.size());
  for (std::size_t r = 0; r < offsets.size(); ++r) scaled_[r] = offsets[r] * width;
  if (scaled_.back() != static_cast<int64_t>(values.size()))
    throw Error(std::string("step shard: ") + what + ": " + std::to_string(values.size()) +
                " values for " + std::to_string(scaled_.back()));
  shard_->share(values, scaled_, what);
}

}  // namespace polyprobe::detail
