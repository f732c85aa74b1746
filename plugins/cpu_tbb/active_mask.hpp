// Reading a particle mask (pp_score_request::active): a sharded rank's chunk marks a few
// hundred of tens of thousands of particles, and every call reads the whole mask, so the
// zeros are skipped eight at a time.
#pragma once

#include <cstdint>
#include <cstring>

namespace polyprobe::cpu_tbb {

// Calls visit(i) for every i in [first, last) with active[i] != 0, in ascending order.
template <class Visit>
void for_each_active(const uint8_t* active, int64_t first, int64_t last, Visit&& visit) {
  int64_t i = first;
  while (i < last) {
    if (last - i >= 8 && (i & 7) == 0) {
      uint64_t word = 0;
      std::memcpy(&word, active + i, sizeof word);
      if (word == 0) {
        i += 8;
        continue;
      }
    }
    if (active[i] != 0) visit(i);
    ++i;
  }
}

}  // namespace polyprobe::cpu_tbb
