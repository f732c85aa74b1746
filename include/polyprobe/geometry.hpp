// Polytope geometry: tight-frame templates and random rotations.
//
// A template T (V x d) is centred and unit-radius: sum_v t_v = 0, |t_v| = 1 and
// sum_v t_v t_v^T = (V/d) I (a tight frame), which is what makes the barycentric move and the
// finite-difference identities of the radius models exact. Rotations are Haar-distributed on
// SO(d), drawn from a caller-owned std::mt19937_64 so that a seed fixes the whole trajectory;
// both kernels consume the stream in a documented order and never depend on thread count.
#pragma once

#include <polyprobe/tensor.hpp>

#include <cstdint>
#include <random>
#include <span>
#include <string_view>

namespace polyprobe {

enum class PolytopeKind { simplex, orthoplex, cube };

// "simplex", "orthoplex" or "cube"; throws polyprobe::Error otherwise.
PolytopeKind parse_polytope(std::string_view name);
std::string_view to_string(PolytopeKind kind);

// Vertices of the template in dimension d: d + 1, 2 d or 2^d.
int64_t polytope_vertex_count(PolytopeKind kind, int32_t d);

// The V x d template. The simplex is polystep's construction (rows of
// sqrt(1 + 1/d) I - (sqrt(d + 1) + 1) / d^1.5 plus the row 1/sqrt(d), centred and normalised);
// the orthoplex lists +e_0 .. +e_{d-1} then -e_0 .. -e_{d-1}, so vertex j and j + d are an
// antithetic pair; the cube is {-1, +1}^d / sqrt(d) in binary order.
Matrix<double> make_template(PolytopeKind kind, int32_t d);

// How a batch of rotations is drawn. Both are exact Haar samplers on SO(d).
enum class RotationMethod {
  automatic,    // qr below kWideRotationBatch particles x d, householder above
  qr,           // per particle: QR of a Gaussian matrix, columns sign-fixed by diag(R)
  householder,  // batched product of random Householder reflections (Stewart 1980)
};
inline constexpr int64_t kWideRotationBatch = 4096;

// Fills `rotations` (count x d x d, row-major per particle) with Haar rotations. For every
// particle whose row of `bias` (count x d, optional) is nonzero, the first column of its
// rotation is that direction, normalised, and the rest is Haar on its orthogonal complement.
void draw_rotations(std::mt19937_64& rng, int64_t count, int32_t d, RotationMethod method,
                    std::span<double> rotations, std::span<const double> bias = {});

}  // namespace polyprobe
