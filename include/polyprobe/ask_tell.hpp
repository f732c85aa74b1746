// Ask/tell: the polytope optimizer over a swarm of points for black-box objectives.
//
// Each of P particles is a point x_i in R^d. ask() returns every candidate of the coming step
// as one row-major matrix (P V K rows of d, the V K candidates of a particle adjacent, then P
// incumbent rows x_i when the radius model needs them); the caller scores the rows however it
// likes (in parallel, on a cluster) and tell() takes the losses in the same order and moves
// the swarm (one transport problem over all particles). Overhead is a few hundred nanoseconds
// per candidate; state round-trips exactly through save_state/load_state.
#pragma once

#include <polyprobe/optimizer.hpp>
#include <polyprobe/tensor.hpp>

#include <iosfwd>
#include <memory>
#include <span>

namespace polyprobe {

class AskTellOptimizer {
 public:
  // `initial` is P x d with d == config.particle_dim.
  AskTellOptimizer(const Matrix<double>& initial, OptimizerConfig config);
  ~AskTellOptimizer();
  AskTellOptimizer(AskTellOptimizer&&) noexcept;
  AskTellOptimizer& operator=(AskTellOptimizer&&) noexcept;

  // The candidates to score (valid until the next ask or tell). Asking twice without a tell
  // returns the same candidates.
  const Matrix<double>& ask();
  // The losses of the last ask's rows, in order; throws polyprobe::Error on a size mismatch
  // or a tell without an ask.
  StepInfo tell(std::span<const double> losses);

  const Matrix<double>& particles() const;
  int64_t evaluations() const;
  double best_loss() const;  // smallest loss told so far
  std::span<const double> best_point() const;
  void save_state(std::ostream& out) const;
  void load_state(std::istream& in);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace polyprobe
