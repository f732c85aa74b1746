#include <polyprobe/error.hpp>
#include <polyprobe/subspaces.hpp>

namespace polyprobe {

void RankOneSubspace::apply(std::span<const int64_t> coords, std::span<const double> values,
                            std::span<double> params) const {
  if (coords.size() != values.size())
    throw Error("subspace apply: " + std::to_string(coords.size()) + " coordinates but " +
                std::to_string(values.size()) + " values");
  if (static_cast<int64_t>(params.size()) != n_params_)
    throw Error("subspace maps into " + std::to_string(n_params_) +
                " parameters, got a vector of " + std::to_string(params.size()));
  for (std::size_t k = 0; k < coords.size(); ++k) {
    const int64_t index = coords[k];
    if (index < 0) continue;  // padding
    if (index >= dimension())
      throw Error("subspace coordinate " + std::to_string(index) + " is outside [0, " +
                  std::to_string(dimension()) + ")");
    const RankOneCoordinate& c = coords_[static_cast<std::size_t>(index)];
    const double theta = values[k];
    for (int64_t r = 0; r < c.rows; ++r) {
      const double ur = c.row >= 0 ? (r == c.row ? 1.0 : 0.0) : c.u[r];
      if (ur == 0.0) continue;
      double* dst = params.data() + c.offset + r * c.cols;
      if (c.col >= 0)
        dst[c.col] += theta * ur;
      else
        for (int64_t i = 0; i < c.cols; ++i) dst[i] += theta * ur * c.v[i];
    }
  }
}

}  // namespace polyprobe
