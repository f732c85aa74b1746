// AskTellOptimizer: the step engine over a swarm of points.
#include "state_io.hpp"
#include "step_engine.hpp"

#include <polyprobe/ask_tell.hpp>
#include <polyprobe/error.hpp>

#include <limits>
#include <string>
#include <utility>

namespace polyprobe {

class AskTellOptimizer::Impl {
 public:
  Impl(const Matrix<double>& initial, OptimizerConfig config)
      : config_(validated(std::move(config), initial)),
        engine_(config_, config_.particle_dim, initial.rows(), {{0, initial.rows()}},
                config_.solver == TransportSolver::automatic ? TransportSolver::sinkhorn
                                                             : config_.solver),
        particles_(initial),
        moves_(static_cast<std::size_t>(initial.size())) {}

  static OptimizerConfig validated(OptimizerConfig config, const Matrix<double>& initial) {
    config.validate();
    if (initial.rows() < 1) throw Error("AskTellOptimizer: the swarm needs at least one particle");
    if (initial.cols() != config.particle_dim)
      throw Error("AskTellOptimizer: initial points have " + std::to_string(initial.cols()) +
                  " columns but particle_dim is " + std::to_string(config.particle_dim) +
                  "; set config.particle_dim to the problem dimension");
    if (config.multifidelity_screen)
      throw Error("AskTellOptimizer: multifidelity_screen needs a batch; turn it off for ask/tell");
    if (config.subspace_rotation_interval != 0)
      throw Error(
          "AskTellOptimizer: subspace_rotation_interval rotates a model's subspace; ask/tell "
          "has none (set it to 0)");
    if (config.adaptive_probes)
      throw Error(
          "AskTellOptimizer: adaptive_probes would leave asked rows unused; turn it off "
          "for ask/tell");
    if (config.radius.trust_reject)
      throw Error(
          "AskTellOptimizer: radius.trust_reject scores the trial point before the candidates, "
          "which one batched ask cannot do; turn it off for ask/tell");
    return config;
  }

  // Runs momentum-only steps (no evaluation) until the next step needs scores, then plans it.
  void prepare() {
    while (!engine_.next_is_scored()) {
      engine_.coast(moves_);
      apply_moves();
    }
    engine_.plan(0);
    fill_asked();
  }

  // The planned step's candidates X_i + displacement, then the incumbents when needed.
  void fill_asked() {
    const int64_t P = engine_.particle_count(), V = engine_.vertex_count();
    const int32_t K = engine_.probes(), d = engine_.dim();
    asked_.resize(P * V * K + (engine_.needs_incumbent() ? P : 0), d);
    const double* disp = engine_.displacements().data();
    for (int64_t i = 0; i < P; ++i)
      for (int64_t c = i * V * K; c < (i + 1) * V * K; ++c)
        for (int32_t j = 0; j < d; ++j) asked_(c, j) = particles_(i, j) + disp[c * d + j];
    if (engine_.needs_incumbent()) asked_.bottomRows(P) = particles_;
    pending_ = true;
  }

  void apply_moves() {
    for (Eigen::Index c = 0; c < particles_.size(); ++c)
      particles_.data()[c] += moves_[static_cast<std::size_t>(c)];
  }

  OptimizerConfig config_;
  detail::StepEngine engine_;
  Matrix<double> particles_;
  Matrix<double> asked_;
  std::vector<double> moves_;
  bool pending_ = false;
  int64_t evaluations_ = 0;
  double best_loss_ = std::numeric_limits<double>::infinity();
  std::vector<double> best_point_;
};

AskTellOptimizer::AskTellOptimizer(const Matrix<double>& initial, OptimizerConfig config)
    : impl_(std::make_unique<Impl>(initial, std::move(config))) {}
AskTellOptimizer::~AskTellOptimizer() = default;
AskTellOptimizer::AskTellOptimizer(AskTellOptimizer&&) noexcept = default;
AskTellOptimizer& AskTellOptimizer::operator=(AskTellOptimizer&&) noexcept = default;

const Matrix<double>& AskTellOptimizer::ask() {
  if (!impl_->pending_) impl_->prepare();
  return impl_->asked_;
}

StepInfo AskTellOptimizer::tell(std::span<const double> losses) {
  Impl& s = *impl_;
  if (!s.pending_) throw Error("AskTellOptimizer::tell without a pending ask(); call ask() first");
  if (static_cast<Eigen::Index>(losses.size()) != s.asked_.rows())
    throw Error("AskTellOptimizer::tell: got " + std::to_string(losses.size()) + " losses for " +
                std::to_string(s.asked_.rows()) + " asked candidates");
  for (std::size_t r = 0; r < losses.size(); ++r)
    if (losses[r] < s.best_loss_) {
      s.best_loss_ = losses[r];
      const auto row = s.asked_.row(static_cast<Eigen::Index>(r));
      s.best_point_.assign(row.data(), row.data() + row.size());
    }
  const auto candidates = static_cast<std::size_t>(s.engine_.candidates_per_step());
  StepInfo info = s.engine_.finish(losses.first(candidates), losses.subspan(candidates), s.moves_);
  info.candidates = static_cast<int64_t>(losses.size());
  if (!info.reverted) s.apply_moves();
  s.evaluations_ += static_cast<int64_t>(losses.size());
  s.pending_ = false;
  return info;
}

const Matrix<double>& AskTellOptimizer::particles() const { return impl_->particles_; }
int64_t AskTellOptimizer::evaluations() const { return impl_->evaluations_; }
double AskTellOptimizer::best_loss() const { return impl_->best_loss_; }
std::span<const double> AskTellOptimizer::best_point() const { return impl_->best_point_; }

void AskTellOptimizer::save_state(std::ostream& out) const {
  const Impl& s = *impl_;
  state_io::put_tag(out, "polyprobe-ask-tell-state-v1");
  out << '\n';
  std::vector<double> particles(s.particles_.data(), s.particles_.data() + s.particles_.size());
  state_io::put(out, "ask_tell.particles", particles);
  state_io::put(out, "ask_tell.evaluations", s.evaluations_);
  state_io::put(out, "ask_tell.best_loss", s.best_loss_);
  state_io::put(out, "ask_tell.best_point", s.best_point_);
  state_io::put(out, "ask_tell.pending", s.pending_ ? 1 : 0);
  s.engine_.save(out);
}

void AskTellOptimizer::load_state(std::istream& in) {
  Impl& s = *impl_;
  state_io::expect_tag(in, "polyprobe-ask-tell-state-v1");
  std::vector<double> particles;
  state_io::get(in, "ask_tell.particles", particles);
  if (static_cast<Eigen::Index>(particles.size()) != s.particles_.size())
    throw Error("ask/tell checkpoint: written for " + std::to_string(particles.size()) +
                " particle coordinates, this optimizer has " + std::to_string(s.particles_.size()));
  std::copy(particles.begin(), particles.end(), s.particles_.data());
  state_io::get(in, "ask_tell.evaluations", s.evaluations_);
  state_io::get(in, "ask_tell.best_loss", s.best_loss_);
  state_io::get(in, "ask_tell.best_point", s.best_point_);
  int pending = 0;
  state_io::get(in, "ask_tell.pending", pending);
  s.pending_ = false;
  s.engine_.load(in);
  // The engine re-planned a pending step exactly; rebuild the asked matrix from it.
  if (pending != 0) s.fill_asked();
}

}  // namespace polyprobe
