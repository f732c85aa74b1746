// FactoredSubspace: dW = A B with B fixed; the coordinates are the entries of A.
#include "subspace/basis_impl.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/subspaces.hpp>

#include <algorithm>

namespace polyprobe {

std::unique_ptr<FactoredSubspace> FactoredSubspace::from_layout(
    const std::vector<ParameterEntry>& layout, int64_t n_params, int64_t rank, uint64_t seed) {
  if (rank <= 0)
    throw Error("factored subspace: rank must be positive, got " + std::to_string(rank));
  std::unique_ptr<FactoredSubspace> s(new FactoredSubspace());
  s->n_params_ = n_params;
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> first_basis;
  for (const ParameterEntry& p : layout) {
    const detail::MatrixShape m = detail::matrix_shape(p.shape);
    SubspaceEntry e{p.name, m.rows, m.cols, 0, 0, 0, 0, !m.is_matrix};
    first_basis.push_back(s->bases_.size());
    if (e.raw) {
      e.coords = p.size;
    } else {
      e.rank = std::min(rank, m.cols);
      e.coords = e.coords_a = m.rows * e.rank;
      for (auto& row : detail::orthonormal_columns(m.cols, e.rank, false, rng))
        s->bases_.push_back(std::move(row));  // the rows of B
    }
    s->entries_.push_back(e);
  }
  for (std::size_t k = 0; k < layout.size(); ++k) {
    const SubspaceEntry& e = s->entries_[k];
    for (int64_t t = 0; t < e.coords; ++t) {
      if (e.raw)
        s->coords_.push_back({layout[k].offset, e.rows, 1, t, 0, nullptr, nullptr});
      else
        s->coords_.push_back(
            {layout[k].offset, e.rows, e.cols, t / e.rank, -1, nullptr,
             s->bases_[first_basis[k] + static_cast<std::size_t>(t % e.rank)].data()});
    }
  }
  return s;
}

}  // namespace polyprobe
