// The CUDA evaluator session (plugin API 2), behind a small interface free of CUDA types so
// that the ABI glue (plugin.cpp) is plain C++.
#pragma once

#include <polyprobe/plugin/abi.h>

#include <cstdint>
#include <memory>

namespace polyprobe::cuda {

class Session {
 public:
  virtual ~Session() = default;
  virtual void set_batch(const pp_batch_view& batch) = 0;
  virtual void set_particles(const pp_particle_layout& layout) = 0;
  virtual void set_incumbent(const pp_tensor& theta) = 0;
  virtual void move_incumbent(const double* moves) = 0;
  // losses == NULL (polytope form): they stay on the device for transport(), next.
  virtual void score(const pp_score_request& request, double* losses, double* incumbent_loss) = 0;
  virtual void transport(const pp_transport_request& request) = 0;
  // Whether score() draws rotations of particles of dimension d from the optimizer's stream
  // itself (pp_score_request::rotations_from_stream): those of d = 2, the host's bits.
  bool draws_rotations(int32_t d) const { return d == 2; }
  virtual void read_incumbent(pp_tensor& theta) = 0;
  virtual const char* explain() = 0;
};

// Throws std::invalid_argument when the model is out of scope (unsupported_reason says why).
std::unique_ptr<Session> make_session(const pp_model_view& model, const pp_loss_view& loss,
                                      const pp_session_options& options);

// The paths a session can be forced to, for messages.
// "layered" keeps every candidate on the layer-by-layer path (no fused tail): for tests
// and for measuring what the fused tail gains.
inline constexpr const char* kPathNames =
    "auto, sparse, subspace-delta, layered, dense, materialised";

}  // namespace polyprobe::cuda
