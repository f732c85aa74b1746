// Subspaces: a linear map from search coordinates theta (dimension m) to parameter changes.
//
// The optimizer searches theta; a move absorbs S(theta) into the model's parameters, so
// the incumbent is always theta = 0. Evaluators use the map to turn a candidate's
// coordinate displacement into its parameter change; fast paths use the structure of the
// concrete subspace (hybrid bases, factored A B) where they recognise it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace polyprobe {

class Subspace {
 public:
  virtual ~Subspace() = default;
  virtual std::string kind() const = 0;
  // m, the number of search coordinates.
  virtual int64_t dimension() const = 0;
  // The number of model parameters this maps into.
  virtual int64_t parameter_count() const = 0;
  // params += S(theta_delta), where theta_delta is zero but at `coords` (with -1 skipped).
  virtual void apply(std::span<const int64_t> coords, std::span<const double> values,
                     std::span<double> params) const = 0;
};

}  // namespace polyprobe
