// The vectorised loops of vector_math.hpp, one clone per x86-64 level (the dynamic loader
// picks the best the CPU runs; elementwise IEEE arithmetic without contraction gives every
// clone the same bits). Compiled with -fno-trapping-math (sources.cmake): otherwise GCC
// will not turn the range checks' selects into blends, and leaves the loops scalar.
#include "vector_math.hpp"

#include <polyprobe/plugin/kernels/plane_rotation.hpp>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define POLYPROBE_X86_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define POLYPROBE_X86_CLONES
#endif

namespace polyprobe::detail {

POLYPROBE_X86_CLONES void exp_in_place(double* x, std::ptrdiff_t n) {
  for (std::ptrdiff_t i = 0; i < n; ++i) x[i] = vector_exp(x[i]);
}

POLYPROBE_X86_CLONES void cos_sin_turns(const double* u, double* c, double* s, std::ptrdiff_t n) {
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const kernels::CosSin r = kernels::cos_sin_turn(u[i]);
    c[i] = r.c;
    s[i] = r.s;
  }
}

}  // namespace polyprobe::detail
