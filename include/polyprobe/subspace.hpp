// Subspaces: a linear map from search coordinates theta (dimension m) to parameter changes.
//
// The optimizer searches theta; a move absorbs S(theta) into the model's parameters, so
// the incumbent is always theta = 0. Evaluators use the map to turn a candidate's
// coordinate displacement into its parameter change; fast paths use the structure of the
// concrete subspace (hybrid bases, factored A B) where they recognise it.
//
// Rotation (--subspace-rotation-interval): a kind that can_rotate() redraws its vectors for
// epoch k from a seed derived from (its creation seed, k), keeping its kind, dimension and
// coordinate layout. Because every move is already absorbed into the parameters, changing
// the map loses nothing; and because the map of epoch k is a pure function of the settings
// and k, a resumed run rebuilds exactly the map the interrupted one had.
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

  // Whether rotate_to() can change this map (false: it throws for any epoch but 0).
  virtual bool can_rotate() const { return false; }
  // Makes the map the one of `epoch` (0: as created), drawn from rotation_seed(seed, epoch);
  // the dimension and what each coordinate moves (tensor, row or column) stay. A no-op when
  // already there. Not thread-safe: no evaluation may run meanwhile. Throws polyprobe::Error
  // when the kind cannot rotate or a plugin's redraw fails (the map is then unchanged).
  void rotate_to(uint64_t epoch);
  uint64_t epoch() const { return epoch_; }
  // Changes whenever the map does. Evaluators that keep anything derived from the map (a
  // plugin session, cached projections) compare it on every call and rebuild when it moved.
  uint64_t generation() const { return generation_; }

 protected:
  // Redraws the vectors for `epoch` in place (called by rotate_to with a new epoch).
  virtual void redraw(uint64_t epoch);

 private:
  uint64_t epoch_ = 0;
  uint64_t generation_ = 0;
};

// The seed a subspace created with `seed` draws its vectors of `epoch` from: `seed` itself
// for epoch 0 (so a run without rotation draws what it always drew), a mix of both after.
uint64_t rotation_seed(uint64_t seed, uint64_t epoch);

}  // namespace polyprobe
