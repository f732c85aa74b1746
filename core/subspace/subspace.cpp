// Subspace: rotation between epochs (the common half; kinds redraw their own vectors).
#include <polyprobe/error.hpp>
#include <polyprobe/subspace.hpp>

namespace polyprobe {

void Subspace::rotate_to(uint64_t epoch) {
  if (epoch == epoch_) return;
  redraw(epoch);  // throws, leaving the map as it was, when it cannot
  epoch_ = epoch;
  ++generation_;
}

void Subspace::redraw(uint64_t /*epoch*/) {
  throw Error("subspace '" + kind() +
              "' cannot rotate (its vectors are fixed); drop --subspace-rotation-interval or "
              "use --subspace hybrid or factored");
}

uint64_t rotation_seed(uint64_t seed, uint64_t epoch) {
  if (epoch == 0) return seed;
  // splitmix64 of the pair: neighbouring epochs (and seeds) give unrelated streams.
  uint64_t z = seed ^ (epoch * 0x9E3779B97F4A7C15ull);
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace polyprobe
