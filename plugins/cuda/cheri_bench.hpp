// The cuda plugin's own benchmarks (pp_plugin.bench, reached by `polyprobe bench cheri
// --bench-device cuda`): kernels timed on the device with CUDA events, next to the device's
// measured bf16 tensor-core rate and copy bandwidth, the floors their records are read against.
#pragma once

#include <string>

namespace polyprobe::cuda {

// Runs benchmark `suite` ("cheri") with `options_json` (a JSON object; unknown keys are an
// error) and returns {"records": [...]} as JSON text. Throws std::invalid_argument for an
// unknown suite or bad options, std::runtime_error for a CUDA failure. Host thread only.
std::string run_bench(const std::string& suite, const std::string& options_json);

}  // namespace polyprobe::cuda
