// The factored subspace: for every weight W (out x in, higher ranks flattened to out x rest)
// dW = A B with B (r x in) fixed orthonormal rows drawn once from the seed; the search
// coordinates are the entries of A (row-major, so coordinate t moves row t / r along B's
// row t % r) and the raw entries of every 1-D tensor (biases). A linear layer then computes
// x W^T + (x B^T) A^T: the projections x B^T are shared by every coordinate of the weight.
// Its search is limited to the input directions B spans.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace polyprobe::factored {

class FactoredSubspace {
 public:
  // Throws std::invalid_argument with the reason when the model cannot be spanned: a weight
  // read through a transform (quantised or binary weights, whose effective values are of
  // another dtype than the model's floats) would move non-linearly along A B, so such
  // mixed-dtype models need per-entry subspaces (hybrid). With max_dimension > 0 the rank is
  // the largest r <= rank whose dimension fits.
  FactoredSubspace(const pp_model_view& model, std::span<const pp_param_entry> entries,
                   const pp_subspace_options& options);

  // The view evaluators read; points into this object.
  pp_subspace_view view() const;
  int64_t rank() const { return rank_; }

 private:
  int64_t rank_ = 0;
  int64_t n_params_ = 0;
  std::vector<std::vector<double>> rows_;  // the rows of every B, weight after weight
  std::vector<pp_subspace_coord> coords_;
};

// r orthonormal rows of length n (r <= n) from a Gaussian r x n matrix drawn from `seed`'s
// stream `stream` (row-major draw order), by modified Gram-Schmidt applied twice.
std::vector<std::vector<double>> orthonormal_rows(int64_t r, int64_t n, uint64_t seed,
                                                  uint64_t stream);

}  // namespace polyprobe::factored
