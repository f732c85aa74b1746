// The argument check shared by the CPU and CUDA "factored_correction" operations
// (correction.hpp).
#include "correction.hpp"

namespace polyprobe::factored {

std::string project_args_error(const pp_factored_project_args& a) {
  if (a.struct_size < sizeof(pp_factored_project_args))
    return "arguments from an older SDK (struct_size " + std::to_string(a.struct_size) + ")";
  if (a.dtype != PP_DTYPE_F32 && a.dtype != PP_DTYPE_F64)
    return "dtype " + std::to_string(a.dtype) + " (it computes float32 or float64)";
  if (a.samples < 0 || a.width < 0 || a.n_dirs < 0)
    return "negative sizes (samples " + std::to_string(a.samples) + ", width " +
           std::to_string(a.width) + ", directions " + std::to_string(a.n_dirs) + ")";
  if (a.samples == 0 || a.n_dirs == 0) return {};
  if (a.x == nullptr || a.dirs == nullptr || a.out == nullptr) return "a null tensor";
  if (a.x_stride < a.width || a.dirs_stride < a.width || a.out_stride < a.samples)
    return "a row stride shorter than its row (x " + std::to_string(a.x_stride) + ", dirs " +
           std::to_string(a.dirs_stride) + ", out " + std::to_string(a.out_stride) + " for width " +
           std::to_string(a.width) + " and " + std::to_string(a.samples) + " samples)";
  return {};
}

}  // namespace polyprobe::factored
