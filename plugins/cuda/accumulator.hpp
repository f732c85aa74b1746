// The cuda plugin's accumulator component (pp_accumulator_api): reduce-by-key on the GPU
// with the strategies of accumulate.cuh. Host tensors are staged through device buffers the
// accumulator keeps; device tensors (on its device) are used in place. One accumulator is
// used by one host thread at a time.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <memory>
#include <string>

namespace polyprobe::cuda {

class Accumulator {
 public:
  virtual ~Accumulator() = default;
  virtual void accumulate(int64_t n, const int64_t* keys, const pp_tensor& values, int64_t n_keys,
                          pp_tensor& out) = 0;
  virtual const char* last_strategy() const = 0;
  // pp_accumulator_api::device_benchmark; the JSON lives until the next call.
  virtual const char* device_benchmark(const pp_accumulate_benchmark& spec) = 0;
};

// Throws std::invalid_argument for an unknown strategy or a dtype other than F32/F64.
std::unique_ptr<Accumulator> make_accumulator(const std::string& strategy, int32_t dtype);

}  // namespace polyprobe::cuda
