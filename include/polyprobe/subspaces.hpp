// Rank-one subspaces and the core's concrete one, hybrid (fixed bases on both sides of every
// weight). Plugins add kinds through the registry (PluginRegistry::make_subspace); the
// factored subspace (dW = A B with B fixed) is the plugin factored_subspace.
//
// They are rank-one subspaces: every search coordinate moves one parameter tensor, viewed
// as a rows x cols matrix, by theta * u v^T with u or v (or both) a unit vector. That one
// description is what evaluators need: a coordinate of weight W changes the layer's
// pre-activation by theta * u (v^T x), so a candidate's change is a sum of d such terms.
// The host hands the description to plugins as plain data (pp_subspace_view).
#pragma once

#include <polyprobe/model.hpp>
#include <polyprobe/subspace.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace polyprobe {

// theta moves the rows x cols tensor at `offset` of the flat parameter vector by
// theta * u v^T, where u = e_row when row >= 0 (else the dense `u`, rows values) and
// v = e_col when col >= 0 (else the dense `v`, cols values). A bias is rows x 1.
struct RankOneCoordinate {
  int64_t offset = 0;
  int64_t rows = 1, cols = 1;
  int64_t row = 0, col = 0;
  const double* u = nullptr;
  const double* v = nullptr;
};

// How one parameter tensor takes part in a subspace (for explain and tests).
struct SubspaceEntry {
  std::string name;  // "0.weight"
  int64_t rows = 0, cols = 0;
  int64_t coords = 0;    // coordinates in all
  int64_t coords_a = 0;  // hybrid: A-coordinates (rows move along V), factored: all
  int64_t coords_b = 0;  // hybrid: B-coordinates (columns move along U)
  int64_t rank = 0;      // basis rank (0 for a raw entry)
  bool raw = false;      // unprojected coordinates (a bias)
};

// A subspace whose every coordinate is a RankOneCoordinate.
class RankOneSubspace : public Subspace {
 public:
  int64_t dimension() const override { return static_cast<int64_t>(coords_.size()); }
  int64_t parameter_count() const override { return n_params_; }
  void apply(std::span<const int64_t> coords, std::span<const double> values,
             std::span<double> params) const override;
  std::span<const RankOneCoordinate> coordinates() const { return coords_; }
  const std::vector<SubspaceEntry>& entries() const { return entries_; }

 protected:
  RankOneSubspace() = default;
  // Copies would leave the coordinates pointing into the source's bases.
  RankOneSubspace(const RankOneSubspace&) = delete;
  RankOneSubspace& operator=(const RankOneSubspace&) = delete;

  int64_t n_params_ = 0;
  std::vector<RankOneCoordinate> coords_;
  std::vector<SubspaceEntry> entries_;
  std::vector<std::vector<double>> bases_;  // storage the coordinates point into
};

// polystep's HybridSubspace with the budget rule of bench/README.md ("Subspace"): per
// weight W (out x in, higher ranks flattened to out x rest) orthonormal bases U (out x r)
// and V (in x r); coordinates A[o, j] (dW = theta e_o v_j^T) then B[j, i]
// (dW = theta u_j e_i^T); biases pass through raw. With max_subspace_dim below the natural
// total, counts shrink by rule (a) (biases whole, weights scaled) or (b) (everything
// scaled, largest remainders), to fractional ranks.
class HybridSubspace final : public RankOneSubspace {
 public:
  struct Options {
    int64_t rank = 8;
    int64_t max_subspace_dim = 0;  // 0 = no budget
    uint64_t seed = 3;
    bool float32_basis = true;  // round the bases to float32, as the reference stores them
  };
  static std::unique_ptr<HybridSubspace> from_layout(const std::vector<ParameterEntry>& layout,
                                                     int64_t n_params, const Options& options);
  std::string kind() const override { return "hybrid"; }
  // The coordinate counts of every entry under the budget rule, without drawing bases.
  static std::vector<SubspaceEntry> allocate(const std::vector<ParameterEntry>& layout,
                                             int64_t rank, int64_t max_subspace_dim);
  // Rotation redraws U and V from rotation_seed(options.seed, epoch), in place (the
  // coordinates keep pointing at the same storage).
  bool can_rotate() const override { return true; }

 protected:
  void redraw(uint64_t epoch) override;

 private:
  HybridSubspace() = default;
  // Draws every weight's U then V from `seed` into bases_ (appending when empty, else
  // overwriting the vectors of the same sizes).
  void draw_bases(uint64_t seed);
  Options options_;
};

}  // namespace polyprobe
