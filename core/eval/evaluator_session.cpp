// The session half of Evaluator: the host mirror of the incumbent and the default scoring
// of a step through the stateless calls (evaluators without a session of their own).
#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/subspace.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

namespace polyprobe {

std::string_view to_string(CandidateDType dtype) {
  switch (dtype) {
    case CandidateDType::bf16:
      return "bf16";
    case CandidateDType::fp16:
      return "fp16";
    default:
      return "same";
  }
}

CandidateDType parse_candidate_dtype(std::string_view name) {
  if (name == "same" || name.empty()) return CandidateDType::compute;
  if (name == "bf16" || name == "bfloat16") return CandidateDType::bf16;
  if (name == "fp16" || name == "float16" || name == "f16") return CandidateDType::fp16;
  throw Error("unknown candidate dtype '" + std::string(name) +
              "': use same (the compute dtype), bf16 or fp16");
}

namespace {
std::size_t idx(int64_t i) { return static_cast<std::size_t>(i); }
}  // namespace

Evaluator::Evaluator(const Subspace* subspace)
    : move_space_(subspace),
      subspace_generation_(subspace != nullptr ? subspace->generation() : 0) {}

DecoratingEvaluator::DecoratingEvaluator(std::unique_ptr<Evaluator> inner, const char* who,
                                         const Subspace* subspace)
    : Evaluator(subspace), inner_(std::move(inner)) {
  if (!inner_) throw Error(std::string(who) + ": no evaluator to wrap");
  share_mirror_of(*inner_);
}

void Evaluator::follow_subspace() {
  if (move_space_ == nullptr || move_space_->generation() == subspace_generation_) return;
  subspace_generation_ = move_space_->generation();
  session_subspace_changed();
}

void Evaluator::bind_particles(const ParticleMap& particles, const Matrix<double>& polytope,
                               int32_t probes) {
  follow_subspace();
  if (probes < 1) throw Error("bind_particles: the probe count must be at least 1");
  if (polytope.size() > 0 && polytope.cols() != particles.d)
    throw Error("bind_particles: the polytope has " + std::to_string(polytope.cols()) +
                " columns, the particles d = " + std::to_string(particles.d));
  particles_ = particles;
  polytope_ = polytope;
  probes_ = probes;
  bound_ = true;
  static std::atomic<uint64_t> bindings{0};
  binding_ = ++bindings;
  session_particles();
}

bool Evaluator::has_particles(const ParticleMap& particles, const Matrix<double>& polytope,
                              int32_t probes) const {
  return bound_ && probes == probes_ && particles.d == particles_.d &&
         particles.coords == particles_.coords && polytope.rows() == polytope_.rows() &&
         polytope.cols() == polytope_.cols() && polytope == polytope_;
}

void Evaluator::sync_incumbent(std::span<const double> theta) {
  follow_subspace();
  if (mirror_owner_ != nullptr) {
    mirror_owner_->sync_incumbent(theta);
    has_incumbent_ = true;
    return;
  }
  if (has_incumbent_ && incumbent_.size() == theta.size() &&
      std::memcmp(incumbent_.data(), theta.data(), theta.size_bytes()) == 0)
    return;
  incumbent_.assign(theta.begin(), theta.end());
  has_incumbent_ = true;
  session_incumbent();
}

void Evaluator::move_incumbent(std::span<const double> moves, std::span<const double> moved) {
  follow_subspace();
  if (!has_incumbent_) throw Error("move_incumbent before sync_incumbent");
  if (!bound_) throw Error("move_incumbent before bind_particles");
  if (moves.size() != particles_.coords.size())
    throw Error("move_incumbent: " + std::to_string(moves.size()) + " moves for " +
                std::to_string(particles_.coords.size()) + " particle coordinates");
  if (mirror_owner_ != nullptr) {
    mirror_owner_->move_incumbent(moves, moved);
    return;
  }
  if (!moved.empty()) {
    if (moved.size() != incumbent_.size())
      throw Error("move_incumbent: a moved copy of " + std::to_string(moved.size()) +
                  " values for an incumbent of " + std::to_string(incumbent_.size()));
    std::copy(moved.begin(), moved.end(), incumbent_.begin());
  } else if (move_space_ != nullptr) {
    move_space_->apply(particles_.coords, moves, incumbent_);
  } else {
    for (std::size_t c = 0; c < particles_.coords.size(); ++c) {
      const int64_t coord = particles_.coords[c];
      if (coord >= 0) incumbent_[idx(coord)] += moves[c];
    }
  }
  session_move(moves);
}

void Evaluator::score(const PolytopeProbe& probe, std::span<double> losses,
                      double* incumbent_loss) {
  follow_subspace();
  if (!has_incumbent_ || !bound_) throw Error("score before bind_particles and sync_incumbent");
  const int64_t P = particles_.count(), V = polytope_.rows();
  const int32_t d = particles_.d;
  if (V == 0) throw Error("score: the bound particles have no polytope");
  if (probe.stream != nullptr) {
    if (!draws_rotations(d))
      throw Error("score: evaluator " + name() + " does not draw rotations of dimension " +
                  std::to_string(d) + "; send the directions");
    if (!probe.directions.empty() || !probe.rotations.empty())
      throw Error("score: a probe drawn from the rotation stream carries no directions");
  } else if (static_cast<int64_t>(probe.directions.size()) != P * V * d) {
    throw Error("score: " + std::to_string(probe.directions.size()) +
                " direction values, expected P V d = " + std::to_string(P * V * d));
  }
  if (static_cast<int64_t>(losses.size()) != P * V * probes_ &&
      !(losses.empty() && solves_transport()))
    throw Error("score: the loss buffer holds " + std::to_string(losses.size()) +
                " values, expected P V K = " + std::to_string(P * V * probes_));
  if (!probe.rotations.empty() && static_cast<int64_t>(probe.rotations.size()) != P * d * d)
    throw Error("score: " + std::to_string(probe.rotations.size()) +
                " rotation values, expected P d d = " + std::to_string(P * d * d));
  if (!probe.active.empty() && static_cast<int64_t>(probe.active.size()) != P)
    throw Error("score: " + std::to_string(probe.active.size()) + " active flags for " +
                std::to_string(P) + " particles");
  session_score(probe, losses, incumbent_loss);
}

void Evaluator::score(const CandidateSet& set, std::span<double> losses, double* incumbent_loss) {
  follow_subspace();
  if (!has_incumbent_) throw Error("score before sync_incumbent");
  if (set.size() > 0) {  // the incumbent alone needs no particles
    if (!bound_) throw Error("score before bind_particles");
    set.validate();
    if (set.particles != &particles_ && set.particles->coords != particles_.coords)
      throw Error("score: the candidate set's particles are not the bound ones");
  }
  if (static_cast<int64_t>(losses.size()) != set.size())
    throw Error("loss buffer holds " + std::to_string(losses.size()) + " values for " +
                std::to_string(set.size()) + " candidates");
  session_score(set, losses, incumbent_loss);
}

void Evaluator::solve_transport(const TransportStepRequest&, std::span<TransportBlockResult>) {
  throw Error("evaluator " + name() + " does not solve transports on its device");
}

std::vector<double> Evaluator::read_incumbent() {
  follow_subspace();
  if (!has_incumbent_) throw Error("read_incumbent before sync_incumbent");
  return session_read();
}

void Evaluator::session_score(const PolytopeProbe& probe, std::span<double> losses,
                              double* incumbent_loss) {
  const int64_t P = particles_.count(), V = polytope_.rows();
  const int32_t d = particles_.d, K = probes_;
  scratch_particle_.clear();
  scratch_displacement_.clear();
  for (int64_t i = 0; i < P; ++i) {
    if (!probe.active.empty() && probe.active[idx(i)] == 0) continue;
    for (int64_t v = 0; v < V; ++v)
      for (int32_t k = 1; k <= K; ++k) {
        const double scale = probe.probe_radius * k / (K + 1.0);
        scratch_particle_.push_back(i);
        for (int32_t j = 0; j < d; ++j)
          scratch_displacement_.push_back(scale * probe.directions[idx((i * V + v) * d + j)]);
      }
  }
  scratch_losses_.resize(scratch_particle_.size());
  if (!scratch_particle_.empty()) {
    const CandidateSet set{&particles_, scratch_particle_, scratch_displacement_};
    evaluate(incumbent(), set, scratch_losses_);
  }
  std::size_t next = 0;
  for (int64_t i = 0; i < P; ++i) {
    if (!probe.active.empty() && probe.active[idx(i)] == 0) continue;
    std::copy_n(scratch_losses_.begin() + static_cast<std::ptrdiff_t>(next), V * K,
                losses.begin() + static_cast<std::ptrdiff_t>(i * V * K));
    next += idx(V * K);
  }
  if (incumbent_loss != nullptr) *incumbent_loss = evaluate_base(incumbent());
}

void Evaluator::session_score(const CandidateSet& set, std::span<double> losses,
                              double* incumbent_loss) {
  if (set.size() > 0) {
    const CandidateSet bound{&particles_, set.particle, set.displacement};
    evaluate(incumbent(), bound, losses);
  }
  if (incumbent_loss != nullptr) *incumbent_loss = evaluate_base(incumbent());
}

}  // namespace polyprobe
