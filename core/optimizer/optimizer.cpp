// PolytopeOptimizer: the step API over a Model.
#include "state_io.hpp"
#include "vector_search.hpp"

#include <polyprobe/batch.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/optimizer.hpp>
#include <polyprobe/subspace.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <string>
#include <utility>

namespace polyprobe {

namespace {

using detail::BlockRange;

// Appends the particles of coordinates [first, first + n) and returns them as one block.
BlockRange append_range(ParticleMap& map, int64_t first, int64_t n) {
  const ParticleMap part = ParticleMap::contiguous(n, map.d, first);
  BlockRange block{map.count(), part.count()};
  map.coords.insert(map.coords.end(), part.coords.begin(), part.coords.end());
  return block;
}

// Per-layer and grouped blocks in full space cut each block's coordinate range into its own
// particles (a particle never straddles two blocks); in a subspace the coordinates have no
// layer structure, so the particles are split into as many near-equal consecutive blocks.
void build_particles(const Model& model, const OptimizerConfig& config, const Subspace* subspace,
                     ParticleMap& map, std::vector<BlockRange>& blocks) {
  map.d = subspace != nullptr ? config.subspace_particle_dim : config.particle_dim;
  map.coords.clear();
  blocks.clear();
  const int64_t n = subspace != nullptr ? subspace->dimension() : model.num_parameters();
  if (n <= 0) throw Error("PolytopeOptimizer: the model has no parameters to optimise");
  // Groups of parameter tensors, each a contiguous range of the flat vector.
  std::vector<std::pair<int64_t, int64_t>> groups;  // [first, end)
  const auto& entries = model.parameter_entries();
  if (config.blocks == BlockStrategy::per_layer) {
    for (const ParameterEntry& e : entries) {
      if (!groups.empty() && entries[&e - entries.data() - 1].layer == e.layer)
        groups.back().second = e.offset + e.size;
      else
        groups.emplace_back(e.offset, e.offset + e.size);
    }
  } else if (config.blocks == BlockStrategy::grouped) {
    for (std::size_t i = 0; i < entries.size();
         i += static_cast<std::size_t>(config.block_group_size)) {
      const std::size_t last =
          std::min(entries.size(), i + static_cast<std::size_t>(config.block_group_size)) - 1;
      groups.emplace_back(entries[i].offset, entries[last].offset + entries[last].size);
    }
  }
  if (config.blocks == BlockStrategy::monolithic || groups.size() <= 1) {
    blocks.push_back(append_range(map, 0, n));
    return;
  }
  if (subspace == nullptr) {
    for (const auto& [first, end] : groups) blocks.push_back(append_range(map, first, end - first));
    return;
  }
  blocks.push_back(append_range(map, 0, n));
  const int64_t particles = blocks.back().count;
  const auto count = std::min<int64_t>(static_cast<int64_t>(groups.size()), particles);
  blocks.clear();
  for (int64_t b = 0; b < count; ++b)
    blocks.push_back({b * particles / count, (b + 1) * particles / count - b * particles / count});
}

uint64_t mix(uint64_t h, uint64_t x) {
  uint64_t z = h + 0x9E3779B97F4A7C15ull + x;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The values' words hashed in kFingerprintLanes independent chains, then the chains in order:
// every value counts, and the chains overlap in the pipeline (one chain is a serial run of
// multiplies, about 0.35 ms a step for a 128-image Fashion-MNIST batch; eight take a quarter).
constexpr std::size_t kFingerprintLanes = 8;
template <class Word>
uint64_t fingerprint_words(uint64_t h, const Word* words, std::size_t n) {
  std::array<uint64_t, kFingerprintLanes> lane{};
  for (std::size_t l = 0; l < kFingerprintLanes; ++l) lane[l] = mix(h, l);
  std::size_t i = 0;
  for (; i + kFingerprintLanes <= n; i += kFingerprintLanes)
    for (std::size_t l = 0; l < kFingerprintLanes; ++l)
      lane[l] = mix(lane[l], std::bit_cast<uint64_t>(words[i + l]));
  for (; i < n; ++i) lane[0] = mix(lane[0], std::bit_cast<uint64_t>(words[i]));
  for (uint64_t v : lane) h = mix(h, v);
  return h;
}

// A fingerprint of the batch's contents: re-registering the same batch (after a resume, for
// instance) is no change of objective; any other batch is.
uint64_t batch_fingerprint(const Batch& batch) {
  uint64_t h = mix(0, static_cast<uint64_t>(batch.size()));
  h = fingerprint_words(h, batch.inputs.data(), static_cast<std::size_t>(batch.inputs.size()));
  h = fingerprint_words(h, batch.targets.labels.data(), batch.targets.labels.size());
  h = fingerprint_words(h, batch.targets.values.data(),
                        static_cast<std::size_t>(batch.targets.values.size()));
  return h;
}

}  // namespace

class PolytopeOptimizer::Impl {
 public:
  Impl(Model& model, OptimizerConfig config, Subspace* subspace)
      : model_(model), config_(std::move(config)), subspace_(subspace), search_(make_search()) {}

  detail::VectorSearch make_search() {
    config_.validate();
    if (subspace_ != nullptr && subspace_->parameter_count() != model_.num_parameters())
      throw Error("PolytopeOptimizer: the subspace maps into " +
                  std::to_string(subspace_->parameter_count()) + " parameters but the model has " +
                  std::to_string(model_.num_parameters()));
    if (config_.subspace_rotation_interval > 0 &&
        (subspace_ == nullptr || !subspace_->can_rotate()))
      throw Error(
          "PolytopeOptimizer: subspace_rotation_interval needs a subspace that can rotate "
          "(--subspace hybrid or factored)" +
          (subspace_ == nullptr ? std::string(", not the full space")
                                : ", not '" + subspace_->kind() + "'"));
    ParticleMap map;
    std::vector<BlockRange> blocks;
    build_particles(model_, config_, subspace_, map, blocks);
    return detail::VectorSearch(config_, std::move(map), std::move(blocks), subspace_);
  }

  // Before step `step`: the subspace of its epoch (a pure function of the step, so a resumed
  // run rebuilds the same map); on the step that starts an epoch, the search state in the old
  // coordinates goes. A resumed run past that step keeps the state it loaded.
  void rotate_for(int64_t step) {
    const int64_t interval = config_.subspace_rotation_interval;
    if (interval <= 0) return;
    subspace_->rotate_to(static_cast<uint64_t>(step / interval));
    if (step > 0 && step % interval == 0) search_.engine().change_basis();
  }

  Model& model_;
  OptimizerConfig config_;
  Subspace* subspace_;
  detail::VectorSearch search_;
  Evaluator* evaluator_ = nullptr;
  Evaluator* screen_ = nullptr;
  uint64_t batch_key_ = 0;
};

PolytopeOptimizer::PolytopeOptimizer(Model& model, OptimizerConfig config, Subspace* subspace)
    : impl_(std::make_unique<Impl>(model, std::move(config), subspace)) {}
PolytopeOptimizer::~PolytopeOptimizer() = default;
PolytopeOptimizer::PolytopeOptimizer(PolytopeOptimizer&&) noexcept = default;
PolytopeOptimizer& PolytopeOptimizer::operator=(PolytopeOptimizer&&) noexcept = default;

void PolytopeOptimizer::register_evaluator(Evaluator& evaluator, const Batch& batch) {
  evaluator.register_batch(batch);
  if (impl_->config_.multifidelity_screen && impl_->screen_ != nullptr) {
    const auto rows =
        std::max<int64_t>(1, static_cast<int64_t>(std::llround(impl_->config_.screen_fidelity *
                                                               static_cast<double>(batch.size()))));
    Batch cheap;
    cheap.inputs = batch.inputs.topRows(rows);
    if (batch.targets.is_classification())
      cheap.targets.labels.assign(batch.targets.labels.begin(),
                                  batch.targets.labels.begin() + rows);
    else
      cheap.targets.values = batch.targets.values.topRows(rows);
    impl_->screen_->register_batch(cheap);
  }
  impl_->evaluator_ = &evaluator;
  impl_->batch_key_ = batch_fingerprint(batch);
}

void PolytopeOptimizer::set_screen_evaluator(Evaluator& screen_evaluator) {
  impl_->screen_ = &screen_evaluator;
}

StepInfo PolytopeOptimizer::step(uint64_t objective_token) {
  if (impl_->evaluator_ == nullptr)
    throw Error(
        "PolytopeOptimizer::step: no evaluator; call register_evaluator(evaluator, batch) first");
  impl_->rotate_for(impl_->search_.engine().step_index());
  return impl_->search_.step(impl_->model_.parameters(), *impl_->evaluator_, impl_->screen_,
                             mix(impl_->batch_key_, objective_token));
}

void PolytopeOptimizer::resync_from_model() {
  // The parameters are read from the model at every step, so only the history that refers
  // to the old weights must go: velocity, cached costs and the deferred comparison.
  impl_->search_.engine().forget_history();
}

void PolytopeOptimizer::set_schedule_progress(std::optional<double> fraction) {
  if (fraction && !(*fraction >= 0 && *fraction <= 1))
    throw Error("set_schedule_progress: the fraction of the run must be in [0, 1], got " +
                std::to_string(*fraction));
  impl_->search_.engine().set_run_progress(fraction);
}

void PolytopeOptimizer::gather_state() {
  detail::StepEngine& engine = impl_->search_.engine();
  if (!engine.duals_spread()) return;
  StepShard* shard = impl_->evaluator_ != nullptr ? impl_->evaluator_->step_shard() : nullptr;
  if (shard == nullptr)
    throw Error(
        "gather_state: the state is spread over the processes of a sharded evaluator, and the "
        "registered evaluator shares its steps with none");
  engine.gather_duals(*shard);
}

void PolytopeOptimizer::save_state(std::ostream& out) const {
  state_io::put_tag(out, "polyprobe-optimizer-state-v1");
  out << '\n';
  state_io::put(out, "optimizer.parameters", impl_->model_.num_parameters());
  impl_->search_.save(out);
  if (!out) throw Error("PolytopeOptimizer::save_state: the stream failed while writing");
}

void PolytopeOptimizer::load_state(std::istream& in) {
  state_io::expect_tag(in, "polyprobe-optimizer-state-v1");
  int64_t parameters = 0;
  state_io::get(in, "optimizer.parameters", parameters);
  if (parameters != impl_->model_.num_parameters())
    throw Error("optimizer checkpoint: written for a model with " + std::to_string(parameters) +
                " parameters, this one has " + std::to_string(impl_->model_.num_parameters()));
  impl_->search_.load(in);
}

const OptimizerConfig& PolytopeOptimizer::config() const { return impl_->config_; }
const ParticleMap& PolytopeOptimizer::particles() const { return impl_->search_.particles(); }
int64_t PolytopeOptimizer::steps() const { return impl_->search_.engine().step_index(); }
int64_t PolytopeOptimizer::evaluations() const { return impl_->search_.evaluations(); }
int64_t PolytopeOptimizer::screen_evaluations() const {
  return impl_->search_.screen_evaluations();
}
int64_t PolytopeOptimizer::next_step_cost() const { return impl_->search_.next_step_cost(); }
bool PolytopeOptimizer::uses_trust_region() const {
  return impl_->config_.radius.kind == RadiusModelKind::trust_region;
}

}  // namespace polyprobe
