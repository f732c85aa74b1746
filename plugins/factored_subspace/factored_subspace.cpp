#include "factored_subspace.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

namespace polyprobe::factored {
namespace {

bool is_matrix(const pp_param_entry& e) { return e.ndim >= 2; }
int64_t rows_of(const pp_param_entry& e) { return e.ndim == 0 ? 1 : e.shape[0]; }

int64_t dimension_at(std::span<const pp_param_entry> entries, int64_t rank) {
  int64_t total = 0;
  for (const pp_param_entry& e : entries)
    total += is_matrix(e) ? rows_of(e) * std::min(rank, e.size / rows_of(e)) : e.size;
  return total;
}

}  // namespace

std::vector<std::vector<double>> orthonormal_rows(int64_t r, int64_t n, uint64_t seed,
                                                  uint64_t stream) {
  // One stream per weight, so a weight's basis does not depend on the weights before it.
  std::seed_seq sequence{seed, stream};
  std::mt19937_64 rng(sequence);
  std::normal_distribution<double> gauss;
  std::vector<std::vector<double>> rows(static_cast<std::size_t>(r),
                                        std::vector<double>(static_cast<std::size_t>(n)));
  for (auto& row : rows)
    for (double& x : row) x = gauss(rng);
  // Twice is enough: the second pass removes what rounding left of the first (Giraud et al.).
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t j = 0; j < rows.size(); ++j) {
      for (std::size_t k = 0; k < j; ++k) {
        double dot = 0;
        for (int64_t i = 0; i < n; ++i) dot += rows[j][i] * rows[k][i];
        for (int64_t i = 0; i < n; ++i) rows[j][i] -= dot * rows[k][i];
      }
      double norm = 0;
      for (const double x : rows[j]) norm += x * x;
      norm = std::sqrt(norm);
      if (!(norm > 1e-300)) throw std::runtime_error("factored basis: a degenerate Gaussian draw");
      for (double& x : rows[j]) x /= norm;
    }
  return rows;
}

FactoredSubspace::FactoredSubspace(const pp_model_view& model,
                                   std::span<const pp_param_entry> entries,
                                   const pp_subspace_options& options)
    : n_params_(model.n_params) {
  if (options.rank <= 0)
    throw std::invalid_argument("factored subspace: the rank must be positive, got " +
                                std::to_string(options.rank));
  for (const pp_param_entry& e : entries) {
    if (e.layer < 0 || e.layer >= model.n_layers)
      throw std::invalid_argument("factored subspace: parameter '" + std::string(e.name) +
                                  "' names layer " + std::to_string(e.layer) + " of " +
                                  std::to_string(model.n_layers));
    const pp_layer_view& layer = model.layers[e.layer];
    if (is_matrix(e) && layer.weight_transform != nullptr)
      throw std::invalid_argument(
          "factored subspace: parameter '" + std::string(e.name) + "' of layer " +
          std::to_string(e.layer) + " (" + layer.kind +
          ") is read through a weight transform (quantised or binary weights), so the model "
          "mixes dtypes and dW = A B would move those weights non-linearly; mixed-dtype "
          "models need per-entry subspaces: use --subspace hybrid, or train in full space");
  }
  rank_ = options.rank;
  if (options.max_dimension > 0) {
    while (rank_ > 1 && dimension_at(entries, rank_) > options.max_dimension) --rank_;
    if (dimension_at(entries, rank_) > options.max_dimension)
      throw std::invalid_argument(
          "factored subspace: even rank 1 needs " + std::to_string(dimension_at(entries, 1)) +
          " coordinates (one per weight row, every bias entry), more than the bound " +
          std::to_string(options.max_dimension) +
          "; raise --subspace-dim or use --subspace hybrid");
  }
  std::vector<std::size_t> first_row;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const pp_param_entry& e = entries[k];
    first_row.push_back(rows_.size());
    if (!is_matrix(e)) continue;
    const int64_t cols = e.size / rows_of(e);
    for (auto& row : orthonormal_rows(std::min(rank_, cols), cols, options.seed, k))
      rows_.push_back(std::move(row));
  }
  // Coordinates last: rows_ no longer moves.
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const pp_param_entry& e = entries[k];
    const int64_t rows = rows_of(e);
    if (!is_matrix(e)) {
      for (int64_t t = 0; t < e.size; ++t)
        coords_.push_back({e.offset, e.size, 1, t, 0, nullptr, nullptr});
      continue;
    }
    const int64_t cols = e.size / rows;
    const int64_t r = std::min(rank_, cols);
    for (int64_t t = 0; t < rows * r; ++t)
      coords_.push_back({e.offset, rows, cols, t / r, -1, nullptr,
                         rows_[first_row[k] + static_cast<std::size_t>(t % r)].data()});
  }
}

pp_subspace_view FactoredSubspace::view() const {
  pp_subspace_view v{};
  v.struct_size = sizeof(v);
  v.kind = "factored";
  v.dimension = static_cast<int64_t>(coords_.size());
  v.n_params = n_params_;
  v.coords = coords_.data();
  return v;
}

}  // namespace polyprobe::factored
