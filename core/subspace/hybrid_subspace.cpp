// HybridSubspace: the allocation rule of bench/README.md ("Subspace") and the bases.
#include "subspace/basis_impl.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/subspaces.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace polyprobe {
namespace {

// Decrements the largest count (first on ties) while the total exceeds the budget.
void trim_to_budget(std::vector<SubspaceEntry>& entries, int64_t budget, bool weights_only) {
  auto total = [&] {
    return std::accumulate(entries.begin(), entries.end(), int64_t{0},
                           [](int64_t s, const SubspaceEntry& e) { return s + e.coords; });
  };
  while (total() > budget) {
    SubspaceEntry* largest = nullptr;
    for (SubspaceEntry& e : entries)
      if ((!weights_only || !e.raw) && e.coords > 1 &&
          (largest == nullptr || e.coords > largest->coords))
        largest = &e;
    if (largest == nullptr) break;
    --largest->coords;
  }
}

}  // namespace

std::vector<SubspaceEntry> HybridSubspace::allocate(const std::vector<ParameterEntry>& layout,
                                                    int64_t rank, int64_t max_subspace_dim) {
  if (rank <= 0) throw Error("hybrid subspace: rank must be positive, got " + std::to_string(rank));
  if (max_subspace_dim < 0) throw Error("hybrid subspace: max_subspace_dim must be >= 0");
  std::vector<SubspaceEntry> entries;
  int64_t natural = 0, natural_bias = 0, natural_weights = 0, n_weights = 0;
  for (const ParameterEntry& p : layout) {
    const detail::MatrixShape m = detail::matrix_shape(p.shape);
    SubspaceEntry e{p.name, m.rows, m.cols, 0, 0, 0, 0, !m.is_matrix};
    if (e.raw) {
      e.coords = p.size;
      natural_bias += e.coords;
    } else {
      e.coords = std::min({rank, m.rows, m.cols}) * (m.rows + m.cols);
      natural_weights += e.coords;
      ++n_weights;
    }
    natural += e.coords;
    entries.push_back(e);
  }
  const int64_t budget = max_subspace_dim;
  if (budget > 0 && natural > budget) {
    if (natural_bias + n_weights <= budget) {
      // Rule (a): biases stay whole, weights share what is left in proportion.
      const double share =
          static_cast<double>(budget - natural_bias) / static_cast<double>(natural_weights);
      for (SubspaceEntry& e : entries)
        if (!e.raw)
          e.coords = std::max<int64_t>(
              1, static_cast<int64_t>(std::floor(static_cast<double>(e.coords) * share + 0.5)));
      trim_to_budget(entries, budget, true);
    } else {
      // Rule (b): everything scaled by s = D / N, the rest to the largest remainders.
      const double s = static_cast<double>(budget) / static_cast<double>(natural);
      std::vector<double> fraction(entries.size(), -1.0);
      int64_t assigned = 0;
      for (std::size_t k = 0; k < entries.size(); ++k) {
        const double exact = static_cast<double>(entries[k].coords) * s;
        const auto whole = static_cast<int64_t>(std::floor(exact));
        if (whole >= 1) fraction[k] = exact - static_cast<double>(whole);  // else raised: skipped
        entries[k].coords = std::max<int64_t>(1, whole);
        assigned += entries[k].coords;
      }
      std::vector<std::size_t> order(entries.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](std::size_t a, std::size_t b) { return fraction[a] > fraction[b]; });
      for (std::size_t k = 0; k < order.size() && assigned < budget; ++k)
        if (fraction[order[k]] >= 0.0) ++entries[order[k]].coords, ++assigned;
      trim_to_budget(entries, budget, false);
    }
  }
  // Fractional ranks: A gets its share of the coordinates by the output side, B the rest.
  for (SubspaceEntry& e : entries) {
    if (e.raw) continue;
    e.coords_a = static_cast<int64_t>(std::floor(
        static_cast<double>(e.coords * e.rows) / static_cast<double>(e.rows + e.cols) + 0.5));
    e.coords_b = e.coords - e.coords_a;
    e.rank = std::max<int64_t>(
        {1, (e.coords_a + e.rows - 1) / e.rows, (e.coords_b + e.cols - 1) / e.cols});
  }
  return entries;
}

void HybridSubspace::draw_bases(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const bool fresh = bases_.empty();
  std::size_t next = 0;
  auto store = [&](std::vector<std::vector<double>> columns) {
    for (auto& col : columns) {
      if (fresh)
        bases_.push_back(std::move(col));
      else  // same length: the coordinates' pointers into it stay valid
        std::copy(col.begin(), col.end(), bases_[next++].begin());
    }
  };
  for (const SubspaceEntry& e : entries_) {
    if (e.raw) continue;
    store(detail::orthonormal_columns(e.rows, e.rank, options_.float32_basis, rng));
    store(detail::orthonormal_columns(e.cols, e.rank, options_.float32_basis, rng));
  }
}

void HybridSubspace::redraw(uint64_t epoch) { draw_bases(rotation_seed(options_.seed, epoch)); }

std::unique_ptr<HybridSubspace> HybridSubspace::from_layout(
    const std::vector<ParameterEntry>& layout, int64_t n_params, const Options& options) {
  std::unique_ptr<HybridSubspace> s(new HybridSubspace());
  s->n_params_ = n_params;
  s->options_ = options;
  s->entries_ = allocate(layout, options.rank, options.max_subspace_dim);
  // Bases are drawn first, weight after weight (U then V), so that coordinates can point
  // into storage that no longer moves.
  s->draw_bases(options.seed);
  std::vector<std::size_t> u_index(layout.size()), v_index(layout.size());
  std::size_t next = 0;
  for (std::size_t k = 0; k < layout.size(); ++k) {
    const SubspaceEntry& e = s->entries_[k];
    if (e.raw) continue;
    u_index[k] = next;
    v_index[k] = next + static_cast<std::size_t>(e.rank);
    next += 2 * static_cast<std::size_t>(e.rank);
  }
  for (std::size_t k = 0; k < layout.size(); ++k) {
    const SubspaceEntry& e = s->entries_[k];
    const int64_t offset = layout[k].offset;
    if (e.raw) {
      for (int64_t t = 0; t < e.coords; ++t)
        s->coords_.push_back({offset, e.rows, 1, t, 0, nullptr, nullptr});
      continue;
    }
    for (int64_t t = 0; t < e.coords_a; ++t)  // A[o, j]: row o moves along v_j
      s->coords_.push_back({offset, e.rows, e.cols, t % e.rows, -1, nullptr,
                            s->bases_[v_index[k] + static_cast<std::size_t>(t / e.rows)].data()});
    for (int64_t t = 0; t < e.coords_b; ++t)  // B[j, i]: column i moves along u_j
      s->coords_.push_back({offset, e.rows, e.cols, -1, t % e.cols,
                            s->bases_[u_index[k] + static_cast<std::size_t>(t / e.cols)].data(),
                            nullptr});
  }
  return s;
}

}  // namespace polyprobe
