// Reduce-by-key: out[keys[i], :] += values[i, :] for rows of a fixed width.
//
// Used wherever contributions are summed (per-sample into per-candidate losses,
// barycentric moves, kernel sums). Strategies: `sequential` (one pass in input order),
// `scatter` (atomics or per-thread partials on parallel backends), `segment`
// (owner-computes: contributions grouped by key, each key's owner adding them to its row in
// input order; deterministic for any thread count) and `auto` (chosen from measurement).
// The reference adds in input order, sequentially, and is the yardstick.
#pragma once

#include <polyprobe/tensor.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace polyprobe {

class Accumulator {
 public:
  virtual ~Accumulator() = default;
  virtual std::string name() const = 0;
  // The strategy the last call used: `auto` reports the one it chose; before any call, and
  // for single-strategy accumulators, the configured one.
  virtual std::string last_strategy() const { return name(); }
  // out must be [n_keys, width] (already holding what to add to), values [keys.size(), width].
  // Throws polyprobe::Error for a key out of range or mismatched shapes.
  virtual void accumulate(std::span<const int64_t> keys, ConstMatrixRef<double> values,
                          MatrixRef<double> out) = 0;
  virtual void accumulate(std::span<const int64_t> keys, ConstMatrixRef<float> values,
                          MatrixRef<float> out) = 0;

  // Device accumulators only: times this accumulator on data generated and kept on its
  // device (`rows` rows of `width` values, keys uniform over `n_keys`, from `seed`) and
  // returns the backend's JSON record (pp_accumulate_benchmark in the plugin ABI says what
  // it holds). Throws polyprobe::Error where the accumulator has no device.
  virtual std::string device_benchmark(int64_t n_keys, int64_t rows, int64_t width,
                                       bool single_precision, int repeats, uint64_t seed);
};

std::unique_ptr<Accumulator> make_reference_accumulator();

}  // namespace polyprobe
