// Processes that share one optimizer's steps (the MPI sharding of polyprobe_distributed).
//
// Each process scores only its own particles' candidates and finishes only their part of the
// step (cost rows, transport rows, barycentric move, quadratic fit); what every process needs
// from the others (chunk partials of the step's reductions, the moves, Sinkhorn's row duals)
// crosses through share(). The trajectory stays the bits of one process: every reduction of a
// step's finish adds the partials of fixed chunks of kGrain particles in chunk order whatever
// the process or thread count, and no chunk is split between processes (the bounds are
// multiples of kGrain).
//
// The core knows no MPI: an evaluator that shards its steps returns one of these from
// Evaluator::step_shard(), and the optimizer asks it per step whether to finish sharded; the
// training loop shares its own evaluations (the minibatch after each step, validation, test)
// among the same processes through share().
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace polyprobe {

// Particles [first, last) of a step.
struct ParticleRange {
  int64_t first = 0;
  int64_t last = 0;
};

class StepShard {
 public:
  // Particles per reduction chunk of a step's finish (the bounds' multiple).
  static constexpr int64_t kGrain = 64;

  virtual ~StepShard() = default;

  // Whether the coming score(probe, ...) calls give every process every loss (true, the
  // default: the caller finishes the step alone) or only the losses of the particles it
  // finishes, bounds() (false: the caller finishes those only, through share()). Which process
  // scores which candidates is the evaluator's business (it balances the scoring's cost).
  virtual void gather_losses(bool all) = 0;

  // The particles each process finishes in the last step scored with gather_losses(false):
  // processes + 1 ascending bounds from 0 to P, each a multiple of kGrain but the last;
  // process r finishes [bounds[r], bounds[r + 1]).
  virtual std::span<const int64_t> bounds() const = 0;
  // The particles whose rotations and directions this process needs for the coming step
  // scored with gather_losses(false) (those it will score and those it will finish), as
  // ascending, disjoint ranges: the optimizer plans only these. Called as the step's plan
  // begins, so an implementation may time this process's share of the step from the call.
  virtual std::vector<ParticleRange> planned_particles(int64_t particles) = 0;

  // How many processes share the steps, and this one's index among them (into bounds()).
  virtual int processes() const = 0;
  virtual int index() const = 0;

  // In place, on every process in the same order: process r's entries values[offsets[r],
  // offsets[r + 1]) become everyone's (offsets: processes() + 1 ascending entries from 0 to
  // values.size()). `what` names the exchange in errors (a timed-out or failed collective).
  virtual void share(std::span<double> values, std::span<const int64_t> offsets,
                     const char* what) = 0;
};

}  // namespace polyprobe
