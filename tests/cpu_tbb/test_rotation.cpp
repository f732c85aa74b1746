// Subspace rotation (Subspace::rotate_to) as evaluators see it: after a rotation the bases
// are new and orthonormal with the same layout, and evaluators made before it (cpu_tbb's
// session caches projections per incumbent) give the losses of evaluators made after it.
#include "cpu_tbb/cpu_tbb_fixture.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/subspaces.hpp>

namespace polyprobe::test {
namespace {

// 5 -> 6 -> 7 -> 4 with ReLU and tanh.
const std::vector<std::pair<std::string, nlohmann::json>> kMlp = {
    {"linear", {{"out_features", 6}}},
    {"relu", {}},
    {"linear", {{"out_features", 7}}},
    {"tanh", {}},
    {"linear", {{"out_features", 4}}}};

// Every dense vector of the map, by coordinate (empty where the coordinate has none).
std::vector<std::vector<double>> dense_vectors(const RankOneSubspace& s) {
  std::vector<std::vector<double>> out;
  for (const RankOneCoordinate& c : s.coordinates()) {
    if (c.u != nullptr)
      out.emplace_back(c.u, c.u + c.rows);
    else if (c.v != nullptr)
      out.emplace_back(c.v, c.v + c.cols);
    else
      out.emplace_back();
  }
  return out;
}

// Unit vectors, and the distinct vectors that move one row (or column) of one tensor are
// orthogonal: the bases are orthonormal.
void check_orthonormal(const RankOneSubspace& s) {
  const auto coords = s.coordinates();
  for (std::size_t a = 0; a < coords.size(); ++a) {
    const RankOneCoordinate& x = coords[a];
    const double* xv = x.u != nullptr ? x.u : x.v;
    if (xv == nullptr) continue;
    const int64_t n = x.u != nullptr ? x.rows : x.cols;
    double norm = 0;
    for (int64_t i = 0; i < n; ++i) norm += xv[i] * xv[i];
    CHECK(norm == Approx(1).epsilon(1e-6));  // float32-rounded bases in the hybrid
    for (std::size_t b = a + 1; b < coords.size(); ++b) {
      const RankOneCoordinate& y = coords[b];
      const double* yv = x.u != nullptr ? y.u : y.v;
      if (y.offset != x.offset || yv == nullptr || yv == xv || y.row != x.row || y.col != x.col)
        continue;
      double dot = 0;
      for (int64_t i = 0; i < n; ++i) dot += xv[i] * yv[i];
      CHECK(dot == Approx(0).margin(1e-6));
    }
  }
}

std::vector<std::unique_ptr<Evaluator>> evaluators(const Model& model, const Loss& loss,
                                                   const Batch& batch, const Subspace* s) {
  std::vector<std::unique_ptr<Evaluator>> out;
  out.push_back(make_reference_evaluator(model, loss, s));
  out.push_back(cpu_registry().make_evaluator(model, loss, request("cpu_tbb", DType::f64, "", s)));
  for (auto& e : out) e->register_batch(batch);
  return out;
}

// The session's losses of `cands` around `theta` (and the incumbent's, last).
std::vector<double> session_losses(Evaluator& e, std::span<const double> theta,
                                   const Candidates& cands) {
  if (!e.has_particles(cands.particles, Matrix<double>(), 1))
    e.bind_particles(cands.particles, Matrix<double>(), 1);
  e.sync_incumbent(theta);
  std::vector<double> losses(cands.particle.size() + 1);
  e.score(cands.set(), std::span<double>(losses).first(cands.particle.size()), &losses.back());
  return losses;
}

TEST_CASE("rotation: new orthonormal bases, same layout, evaluators follow (hybrid, factored)",
          "[cpu_tbb][rotation]") {
  Model model = make_model(5, kMlp);
  const auto loss = make_loss("cross_entropy", 1e-3);
  const Batch batch = make_batch(model, 8);
  HybridSubspace::Options options;
  options.rank = 2;
  options.max_subspace_dim = 40;
  std::vector<std::unique_ptr<Subspace>> spaces;
  spaces.push_back(
      HybridSubspace::from_layout(model.parameter_entries(), model.num_parameters(), options));
  spaces.push_back(cpu_registry().make_subspace(model, {"factored", 2, 0, 3}));
  for (const auto& space : spaces) {
    INFO(space->kind());
    auto& s = dynamic_cast<RankOneSubspace&>(*space);
    REQUIRE(s.can_rotate());
    const int64_t dim = s.dimension();
    const Candidates cands = make_candidates(dim, 3, 4, 0.3);
    const std::vector<RankOneCoordinate> layout(s.coordinates().begin(), s.coordinates().end());
    const auto before = dense_vectors(s);
    // Made (and used: cpu_tbb caches the incumbent's projections) before the rotation.
    auto old = evaluators(model, *loss, batch, &s);
    std::vector<double> theta(model.parameters().begin(), model.parameters().end());
    const auto losses_before = session_losses(*old[1], theta, cands);
    CHECK(max_rel_diff(losses_before, session_losses(*old[0], theta, cands)) < 1e-12);

    const uint64_t generation = s.generation();
    s.rotate_to(1);
    CHECK(s.epoch() == 1);
    CHECK(s.generation() != generation);
    REQUIRE(s.dimension() == dim);
    const auto after = dense_vectors(s);
    int64_t changed = 0;
    for (std::size_t k = 0; k < layout.size(); ++k) {
      const RankOneCoordinate& c = s.coordinates()[k];
      CHECK(c.offset == layout[k].offset);  // each coordinate moves what it moved
      CHECK(c.row == layout[k].row);
      CHECK(c.col == layout[k].col);
      changed += after[k] != before[k] ? 1 : 0;
      CHECK(after[k].size() == before[k].size());
    }
    CHECK(changed > dim / 4);  // every weight's coordinates (the biases stay raw)
    check_orthonormal(s);

    // The old evaluators on the rotated map agree with new ones made on it, at the
    // incumbent of before and after a move through the new map.
    auto fresh = evaluators(model, *loss, batch, &s);
    for (int round = 0; round < 2; ++round) {
      INFO("round " << round);
      const auto want = session_losses(*fresh[0], theta, cands);
      CHECK(max_rel_diff(want, losses_before) > 1e-6);  // the rotation changed the losses
      for (std::size_t e = 0; e < old.size(); ++e) {
        INFO(old[e]->name());
        CHECK(max_rel_diff(session_losses(*old[e], theta, cands), want) < 1e-12);
        CHECK(max_rel_diff(session_losses(*fresh[e], theta, cands), want) < 1e-12);
      }
      // Move every evaluator's incumbent (and our copy) along the new map.
      std::vector<double> moves(cands.particles.coords.size());
      for (std::size_t k = 0; k < moves.size(); ++k) moves[k] = 0.01 * static_cast<double>(k % 7);
      for (auto* list : {&old, &fresh})
        for (auto& e : *list) e->move_incumbent(moves);
      s.apply(cands.particles.coords, moves, theta);
      // Every copy of the incumbent moved by the same bits as ours.
      for (auto* list : {&old, &fresh})
        for (auto& e : *list) {
          INFO(e->name());
          const std::vector<double> held = e->read_incumbent();
          REQUIRE(held.size() == theta.size());
          double worst = 0;
          for (std::size_t i = 0; i < held.size(); ++i)
            worst = std::max(worst, std::abs(held[i] - theta[i]));
          CHECK(worst == 0);  // the same arithmetic (kernels/subspace_move.hpp)
        }
    }

    // Back to epoch 0: the map of creation, bit for bit (what resuming relies on).
    s.rotate_to(0);
    CHECK(dense_vectors(s) == before);
  }
}

TEST_CASE("rotation: a kind that cannot rotate says so", "[cpu_tbb][rotation]") {
  class Fixed final : public Subspace {
   public:
    std::string kind() const override { return "fixed"; }
    int64_t dimension() const override { return 1; }
    int64_t parameter_count() const override { return 1; }
    void apply(std::span<const int64_t>, std::span<const double>,
               std::span<double>) const override {}
  } fixed;
  CHECK_FALSE(fixed.can_rotate());
  fixed.rotate_to(0);  // already there
  CHECK_THROWS_WITH(fixed.rotate_to(2), Catch::Contains("'fixed' cannot rotate"));
  CHECK(fixed.epoch() == 0);
  CHECK(rotation_seed(7, 0) == 7);
  CHECK(rotation_seed(7, 1) != rotation_seed(7, 2));
  CHECK(rotation_seed(7, 1) != rotation_seed(8, 1));
}

}  // namespace
}  // namespace polyprobe::test
