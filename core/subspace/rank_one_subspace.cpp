#include <polyprobe/error.hpp>
#include <polyprobe/plugin/kernels/subspace_move.hpp>
#include <polyprobe/subspaces.hpp>

#include <vector>

namespace polyprobe {

void RankOneSubspace::apply(std::span<const int64_t> coords, std::span<const double> values,
                            std::span<double> params) const {
  if (coords.size() != values.size())
    throw Error("subspace apply: " + std::to_string(coords.size()) + " coordinates but " +
                std::to_string(values.size()) + " values");
  if (static_cast<int64_t>(params.size()) != n_params_)
    throw Error("subspace maps into " + std::to_string(n_params_) +
                " parameters, got a vector of " + std::to_string(params.size()));
  std::vector<kernels::SubspaceMove> moves;
  moves.reserve(coords.size());
  for (std::size_t k = 0; k < coords.size(); ++k) {
    const int64_t index = coords[k];
    if (index < 0) continue;  // padding
    if (index >= dimension())
      throw Error("subspace coordinate " + std::to_string(index) + " is outside [0, " +
                  std::to_string(dimension()) + ")");
    const RankOneCoordinate& c = coords_[static_cast<std::size_t>(index)];
    moves.push_back({{c.offset, c.rows, c.cols, c.row, c.col, c.u, c.v}, values[k]});
  }
  // The arithmetic every backend's session uses too (kernels/subspace_move.hpp); checked
  // first, so a bad coordinate leaves params as they were.
  kernels::apply_subspace_moves(moves, params.data());
}

}  // namespace polyprobe
