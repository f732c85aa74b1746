// The quadratic model's per-particle fit (internal): fit_particle_quadratic's arithmetic on
// raw row-major arrays, inline, for the step engine's loop over particles. Through the public
// form a particle cost a call, a span and an Eigen::Ref with runtime strides for a 3 x 2
// fit: 4.5% of a complete mnist64-full step at train's radii (perf). Both forms compute the
// same bits (radius_model.cpp calls this one).
#pragma once

#include <cstdint>

namespace polyprobe::detail {

// losses [vertices], directions [vertices, d] row-major with rows `stride` apart, gradient [d]
// (written); returns the curvature. See fit_particle_quadratic in <polyprobe/radius_model.hpp>.
inline double fit_particle_quadratic_rows(const double* losses, int64_t vertices, double incumbent,
                                          const double* directions, int64_t stride, int64_t d,
                                          double scaled_radius, double* gradient) {
  double mean = 0;
  for (int64_t v = 0; v < vertices; ++v) mean += losses[v];
  mean /= static_cast<double>(vertices);
  // L_ref = mean: any constant cancels because the frame is centred; the mean keeps the
  // terms small, so the sum loses no digits.
  for (int64_t j = 0; j < d; ++j) gradient[j] = 0.0;
  for (int64_t v = 0; v < vertices; ++v)
    for (int64_t j = 0; j < d; ++j) gradient[j] += (losses[v] - mean) * directions[v * stride + j];
  const double scale = static_cast<double>(d) / (static_cast<double>(vertices) * scaled_radius);
  for (int64_t j = 0; j < d; ++j) gradient[j] *= scale;
  return 2 * (mean - incumbent) / (scaled_radius * scaled_radius);
}

}  // namespace polyprobe::detail
