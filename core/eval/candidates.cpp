#include <polyprobe/candidates.hpp>
#include <polyprobe/error.hpp>

#include <vector>

namespace polyprobe {

ParticleMap ParticleMap::contiguous(int64_t n, int32_t d, int64_t first) {
  if (d <= 0) throw Error("particle dimension d must be positive, got " + std::to_string(d));
  if (n < 0) throw Error("cannot cut a negative number of coordinates into particles");
  ParticleMap map;
  map.d = d;
  const int64_t count = (n + d - 1) / d;
  map.coords.resize(static_cast<std::size_t>(count * d));
  for (int64_t i = 0; i < count * d; ++i)
    map.coords[static_cast<std::size_t>(i)] = i < n ? first + i : -1;
  return map;
}

void ParticleMap::validate(int64_t n) const {
  if (d <= 0) throw Error("particle dimension d must be positive, got " + std::to_string(d));
  if (coords.size() % static_cast<std::size_t>(d) != 0)
    throw Error("particle map holds " + std::to_string(coords.size()) +
                " coordinates, not a multiple of d = " + std::to_string(d));
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  for (std::size_t i = 0; i < coords.size(); ++i) {
    const int64_t c = coords[i];
    if (c == -1) continue;
    if (c < 0 || c >= n)
      throw Error("particle " + std::to_string(i / static_cast<std::size_t>(d)) +
                  " names coordinate " + std::to_string(c) + ", outside [0, " + std::to_string(n) +
                  ")");
    if (seen[static_cast<std::size_t>(c)])
      throw Error("coordinate " + std::to_string(c) + " belongs to two particles");
    seen[static_cast<std::size_t>(c)] = true;
  }
}

void CandidateSet::validate() const {
  if (particles == nullptr) throw Error("candidate set has no particle map");
  if (displacement.size() != particle.size() * static_cast<std::size_t>(particles->d))
    throw Error("candidate set has " + std::to_string(particle.size()) + " candidates but " +
                std::to_string(displacement.size()) +
                " displacement values (d = " + std::to_string(particles->d) + ")");
  for (std::size_t c = 0; c < particle.size(); ++c)
    if (particle[c] < 0 || particle[c] >= particles->count())
      throw Error("candidate " + std::to_string(c) + " moves particle " +
                  std::to_string(particle[c]) + ", but there are " +
                  std::to_string(particles->count()));
}

}  // namespace polyprobe
