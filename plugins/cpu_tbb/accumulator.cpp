#include "accumulator.hpp"

#include <polyprobe/plugin/plugin.hpp>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace polyprobe::cpu_tbb {
namespace {

enum class Strategy { sequential, scatter, segment, automatic };

// Chunks of the counting sort: fixed, so the grouped order is the same for any thread count.
constexpr int64_t kSortChunks = 64;

class Accumulator {
 public:
  Accumulator(Strategy strategy, int32_t dtype) : strategy_(strategy), dtype_(dtype) {}

  void set_threads(int32_t threads) {
    arena_ = threads > 0 ? std::make_unique<tbb::task_arena>(threads)
                         : std::make_unique<tbb::task_arena>();
  }

  void accumulate(int64_t n, const int64_t* keys, const pp_tensor& values, int64_t n_keys,
                  pp_tensor& out) {
    if (values.dtype != dtype_ || out.dtype != dtype_)
      throw std::invalid_argument(std::string("accumulator made for ") + pp::dtype_name(dtype_) +
                                  ", got " + pp::dtype_name(values.dtype));
    const int64_t width = pp::row_size(values);
    if (pp::rows(values) != n || pp::rows(out) != n_keys || pp::row_size(out) != width)
      throw std::invalid_argument("accumulate: values must be [n, width] and out [n_keys, width]");
    for (int64_t i = 0; i < n; ++i)
      if (keys[i] < 0 || keys[i] >= n_keys)
        throw std::invalid_argument("key " + std::to_string(keys[i]) + " at " + std::to_string(i) +
                                    " is outside [0, " + std::to_string(n_keys) + ")");
    if (!arena_) set_threads(0);
    last_ = strategy_ == Strategy::automatic ? choose_strategy(arena_->max_concurrency(), width)
                                             : strategy_;
    arena_->execute([&] {
      if (dtype_ == PP_DTYPE_F32)
        run<float>(n, keys, values, n_keys, width, out);
      else
        run<double>(n, keys, values, n_keys, width, out);
    });
  }

  const char* last_strategy() const {
    switch (last_) {
      case Strategy::sequential:
        return "sequential";
      case Strategy::scatter:
        return "scatter";
      default:
        return "segment";
    }
  }

 private:
  // Measured on a 16-core Xeon and the 2-core Zen 5 VM (docs/benchmarks.md, "Accumulators"):
  // atomic scatter never won (every element a compare-and-swap), and the segment strategy's
  // counting sort and gathers pay for themselves only with 4 or more threads and rows of at
  // least 64 bytes (width 64: 1.6x to 5.6x faster than one pass at 4 and 16 threads; width 3:
  // one pass in input order stays fastest or within 30 %). Both give the reference's bits,
  // so the choice never changes a result.
  static constexpr int kSegmentMinThreads = 4;
  static constexpr int64_t kSegmentMinRowBytes = 64;
  Strategy choose_strategy(int threads, int64_t width) const {
    const int64_t row_bytes = width * (dtype_ == PP_DTYPE_F32 ? 4 : 8);
    return threads >= kSegmentMinThreads && row_bytes >= kSegmentMinRowBytes ? Strategy::segment
                                                                             : Strategy::sequential;
  }

  template <class S>
  void run(int64_t n, const int64_t* keys, const pp_tensor& values, int64_t n_keys, int64_t width,
           pp_tensor& out) {
    const S* v = pp::as_span<const S>(values).data();
    S* o = pp::as_span<S>(out).data();
    if (last_ == Strategy::sequential) {
      for (int64_t i = 0; i < n; ++i) {
        S* dst = o + keys[i] * width;
        const S* src = v + i * width;
        for (int64_t j = 0; j < width; ++j) dst[j] += src[j];
      }
      return;
    }
    if (last_ == Strategy::scatter) {
      tbb::parallel_for(
          tbb::blocked_range<int64_t>(0, n, 1024), [&](const tbb::blocked_range<int64_t>& r) {
            for (int64_t i = r.begin(); i != r.end(); ++i) {
              S* dst = o + keys[i] * width;
              const S* src = v + i * width;
              for (int64_t j = 0; j < width; ++j)
                std::atomic_ref<S>(dst[j]).fetch_add(src[j], std::memory_order_relaxed);
            }
          });
      return;
    }
    // Each key's owner adds its contributions to its row in input order: the same
    // additions in the same order as one sequential pass, so the bits are those of the
    // reference for any thread count.
    group_by_key(n, keys, n_keys);
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n_keys, 256),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        for (int64_t k = r.begin(); k != r.end(); ++k) {
                          S* dst = o + k * width;
                          for (int64_t p = starts_[static_cast<std::size_t>(k)],
                                       end = starts_[static_cast<std::size_t>(k) + 1];
                               p < end; ++p) {
                            const S* src = v + order_[static_cast<std::size_t>(p)] * width;
                            for (int64_t j = 0; j < width; ++j) dst[j] += src[j];
                          }
                        }
                      });
  }

  // Stable counting sort of the contribution indices by key into starts_ / order_.
  void group_by_key(int64_t n, const int64_t* keys, int64_t n_keys) {
    const int64_t chunks = std::min<int64_t>(kSortChunks, std::max<int64_t>(1, n / 4096));
    const int64_t per_chunk = (n + chunks - 1) / chunks;
    counts_.assign(static_cast<std::size_t>(chunks * n_keys), 0);
    tbb::parallel_for(int64_t{0}, chunks, [&](int64_t ch) {
      int64_t* count = counts_.data() + ch * n_keys;
      for (int64_t i = ch * per_chunk; i < std::min(n, (ch + 1) * per_chunk); ++i) ++count[keys[i]];
    });
    // Offsets in (key, chunk) order: a key's contributions stay in input order.
    starts_.assign(static_cast<std::size_t>(n_keys) + 1, 0);
    int64_t running = 0;
    for (int64_t k = 0; k < n_keys; ++k) {
      starts_[static_cast<std::size_t>(k)] = running;
      for (int64_t ch = 0; ch < chunks; ++ch) {
        int64_t& c = counts_[static_cast<std::size_t>(ch * n_keys + k)];
        const int64_t count = c;
        c = running;
        running += count;
      }
    }
    starts_[static_cast<std::size_t>(n_keys)] = running;
    order_.resize(static_cast<std::size_t>(n));
    tbb::parallel_for(int64_t{0}, chunks, [&](int64_t ch) {
      int64_t* next = counts_.data() + ch * n_keys;
      for (int64_t i = ch * per_chunk; i < std::min(n, (ch + 1) * per_chunk); ++i)
        order_[static_cast<std::size_t>(next[keys[i]]++)] = i;
    });
  }

  Strategy strategy_;
  Strategy last_ = Strategy::segment;
  int32_t dtype_;
  std::unique_ptr<tbb::task_arena> arena_;
  std::vector<int64_t> counts_, starts_, order_;
};

int accumulate(void* self, int64_t n, const int64_t* keys, const pp_tensor* values, int64_t n_keys,
               pp_tensor* out, pp_error* err) {
  return pp::guard(
      err, [&] { static_cast<Accumulator*>(self)->accumulate(n, keys, *values, n_keys, *out); });
}
void destroy(void* self) { delete static_cast<Accumulator*>(self); }
int set_threads(void* self, int32_t threads, pp_error* err) {
  return pp::guard(err, [&] { static_cast<Accumulator*>(self)->set_threads(threads); });
}
const char* last_strategy(void* self) { return static_cast<Accumulator*>(self)->last_strategy(); }

const pp_accumulator_api kApi = {
    sizeof(pp_accumulator_api), &accumulate, &destroy, &set_threads, &last_strategy, nullptr};

}  // namespace

void create_accumulator(const char* strategy, int32_t dtype, void** self,
                        const pp_accumulator_api** api) {
  const std::string name = strategy == nullptr ? "auto" : strategy;
  Strategy s;
  if (name == "sequential")
    s = Strategy::sequential;
  else if (name == "scatter")
    s = Strategy::scatter;
  else if (name == "segment")
    s = Strategy::segment;
  else if (name == "auto")
    s = Strategy::automatic;
  else
    throw std::invalid_argument("unknown accumulator strategy '" + name +
                                "' (sequential, scatter, segment, auto)");
  if (dtype != PP_DTYPE_F32 && dtype != PP_DTYPE_F64)
    throw std::invalid_argument(std::string("accumulators sum float32 or float64, not ") +
                                pp::dtype_name(dtype));
  *self = new Accumulator(s, dtype);
  *api = &kApi;
}

}  // namespace polyprobe::cpu_tbb
