// The subspace's dense input directions projected onto the incumbent's activations: row j of
// v_src is v_j^T x for every sample, x the input of the affine layer v_j moves. It is what
// the subspace-delta path reads for an A-coordinate (theta e_o v^T x), and in a factored
// subspace it is the x B^T every candidate of the layer shares.
//
// A layer's directions go through the host's "factored_correction" operation (operations.h;
// the factored_subspace plugin), one call for all of them, when the host offers it for the
// CPU and the dtype and the layer has at least kMinShared directions; otherwise, and when no
// plugin offers it, each is one matrix-vector product here. Removing the plugin only brings
// back the products (the same values to rounding).
#pragma once

#include "model_plan.hpp"
#include "packets.hpp"

#include <polyprobe/plugin/abi.h>

#include <Eigen/Core>

#include <string>
#include <vector>

namespace polyprobe::cpu_tbb {

template <class S>
class DirectionProjections {
 public:
  using Direction = Eigen::Matrix<S, 1, Eigen::Dynamic>;
  // Directions per layer from which the operation is used (`polyprobe bench factored`, an
  // AVX-512 EPYC and Xeon): one call for 8 directions ran 1.05-2.0x as fast as a product per
  // direction, for 32 1.8-3.6x; for 4 it ran 0.68-0.95x at 64 samples and 1.27-1.40x at 512,
  // and below 4 the operation itself runs a product per direction (docs/benchmarks.md,
  // "factored_correction").
  static constexpr std::size_t kMinShared = 8;

  // `directions` and their `layers` as the evaluation context collected them (empty in full
  // space); `host` (may be null) the session's host API. Keeps references to both vectors,
  // which must outlive this.
  DirectionProjections(const ModelPlan& plan, const std::vector<Direction>& directions,
                       const std::vector<int32_t>& layers, const pp_host_api* host);

  // v_src [directions, batch] from acts (acts[l]: the input of layer l, [batch, in]). Rows of
  // directions that are not an affine layer's stay zero. Runs on the calling task arena's
  // threads; results do not depend on their number. One call at a time.
  void compute(const ModelPlan& plan, const std::vector<Mat<S>>& acts, Mat<S>& v_src);

  // For --explain: which layers' directions go through the operation, and why the others
  // do not.
  std::string describe() const;

 private:
  struct SharedLayer {
    int32_t layer = 0;
    std::vector<int32_t> rows;  // the directions of the layer (rows of v_src), ascending
    bool contiguous = false;    // rows are first, first + 1, ...: written in place
    Mat<S> dirs;                // [rows, in]
  };

  const std::vector<Direction>& directions_;
  const std::vector<int32_t>& layers_;
  const pp_factored_correction_table* op_ = nullptr;
  std::string provider_;
  std::vector<SharedLayer> shared_;
  std::vector<char> by_operation_;  // per direction: 1 when a SharedLayer computes it
  Mat<S> scratch_;                  // [rows, batch] of a layer that is not contiguous
};

}  // namespace polyprobe::cpu_tbb
