// The optimizer's threads on oneTBB (step_threads.hpp says why TBB).
#include "step_threads.hpp"

#include <algorithm>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

namespace polyprobe::detail {

struct StepThreads::Arena {
  tbb::task_arena arena;
  explicit Arena(int threads) : arena(threads > 0 ? threads : tbb::task_arena::automatic) {}
};

StepThreads::StepThreads(int threads) { set_threads(threads); }
StepThreads::~StepThreads() = default;
StepThreads::StepThreads(StepThreads&&) noexcept = default;
StepThreads& StepThreads::operator=(StepThreads&&) noexcept = default;

void StepThreads::set_threads(int threads) {
  if (threads < 0) threads = 0;
  if (threads == threads_ && (threads == 1) == (arena_ == nullptr)) return;
  threads_ = threads;
  arena_ = threads == 1 ? nullptr : std::make_unique<Arena>(threads);
}

void StepThreads::for_chunks(
    int64_t count, int64_t grain,
    const std::function<void(int64_t chunk, int64_t begin, int64_t end)>& body) const {
  if (count <= 0) return;
  if (grain <= 0) grain = count;
  const int64_t chunks = chunk_count(count, grain);
  auto run = [&](int64_t c) { body(c, c * grain, std::min(count, (c + 1) * grain)); };
  if (arena_ == nullptr || chunks == 1) {
    for (int64_t c = 0; c < chunks; ++c) run(c);
    return;
  }
  arena_->arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, chunks, 1),
        [&](const tbb::blocked_range<int64_t>& r) {
          for (int64_t c = r.begin(); c < r.end(); ++c) run(c);
        },
        tbb::simple_partitioner());
  });
}

}  // namespace polyprobe::detail
