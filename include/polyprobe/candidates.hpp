// Particles and candidate sets.
//
// A ParticleMap cuts a search vector (the flat parameters, or subspace coordinates) into
// particles of d coordinates; -1 marks padding, which does not exist in the model. A
// CandidateSet is described, not materialised: candidate c is the base vector with particle
// particle[c] moved by displacement[c*d .. c*d+d). The V x K candidates of one particle are
// adjacent; every fast evaluation path relies on that locality.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace polyprobe {

struct ParticleMap {
  int32_t d = 2;
  std::vector<int64_t> coords;  // [count() * d]

  int64_t count() const { return d == 0 ? 0 : static_cast<int64_t>(coords.size()) / d; }
  std::span<const int64_t> particle(int64_t p) const {
    return std::span<const int64_t>(coords).subspan(static_cast<std::size_t>(p * d),
                                                    static_cast<std::size_t>(d));
  }
  // Consecutive coordinates [first, first + n) cut into particles of d, the last padded.
  static ParticleMap contiguous(int64_t n, int32_t d, int64_t first = 0);
  // Throws polyprobe::Error when a coordinate is out of [0, n) or used twice.
  void validate(int64_t n) const;
};

struct CandidateSet {
  const ParticleMap* particles = nullptr;
  std::span<const int64_t> particle;     // [size()]
  std::span<const double> displacement;  // [size() * particles->d]

  int64_t size() const { return static_cast<int64_t>(particle.size()); }
  // Throws polyprobe::Error when spans disagree or a particle index is out of range.
  void validate() const;
};

}  // namespace polyprobe
