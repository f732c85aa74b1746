// The optimizer's own threads (internal): per-particle work of a step on oneTBB.
//
// Why oneTBB and not a pool of our own: the evaluator plugins (cpu_tbb) already run on
// oneTBB, and arenas of one process draw their workers from one shared market, so the
// optimizer's phases and the evaluator's never oversubscribe the cores or keep two sets of
// spinning threads; TBB's fork-join costs microseconds, which matters for the Sinkhorn
// iterations (two parallel passes each). The core links TBB privately: no TBB type appears
// in a public header, and no plugin is involved.
//
// Results never depend on the thread count: for_chunks() cuts [0, count) into chunks of
// `grain` items fixed by count and grain alone, each chunk runs on one thread, and callers
// either write disjoint outputs per item or reduce per-chunk partials in chunk order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace polyprobe::detail {

class StepThreads {
 public:
  // `threads` 0 = all the process may use; 1 runs everything on the calling thread.
  explicit StepThreads(int threads = 1);
  ~StepThreads();
  StepThreads(StepThreads&&) noexcept;
  StepThreads& operator=(StepThreads&&) noexcept;

  // Changes the thread count (no-op when unchanged).
  void set_threads(int threads);
  int threads() const { return threads_; }

  // The number of chunks for_chunks() makes of `count` items.
  static int64_t chunk_count(int64_t count, int64_t grain) {
    return grain <= 0 ? 1 : (count + grain - 1) / grain;
  }
  // Calls body(chunk, begin, end) once for each chunk [chunk * grain, min(count, ...)),
  // possibly concurrently; returns when all are done. Exceptions propagate to the caller.
  void for_chunks(int64_t count, int64_t grain,
                  const std::function<void(int64_t chunk, int64_t begin, int64_t end)>& body) const;

 private:
  struct Arena;
  int threads_ = 1;
  std::unique_ptr<Arena> arena_;  // null when threads_ == 1
};

}  // namespace polyprobe::detail
