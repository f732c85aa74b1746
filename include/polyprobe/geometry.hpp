// Polytope geometry: tight-frame templates and random rotations.
//
// A template T (V x d) is centred and unit-radius: sum_v t_v = 0, |t_v| = 1 and
// sum_v t_v t_v^T = (V/d) I (a tight frame), which is what makes the barycentric move and the
// finite-difference identities of the radius models exact. Rotations are Haar-distributed on
// SO(d), drawn from a counter-based stream (Philox4x32-10, plugin/kernels/philox.hpp): particle
// p's rotation at step s is a function of (seed, s, p) alone, so a seed fixes the whole
// trajectory for any thread count, any split of the particles and any backend that computes
// the same stream.
#pragma once

#include <polyprobe/tensor.hpp>

#include <cstdint>
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

// How a batch of rotations is drawn. Both are exact Haar samplers on SO(d); for d = 2 every
// method draws the angle directly (one uniform: SO(2)'s Haar law), for d = 1 R = 1.
enum class RotationMethod {
  automatic,    // qr below kWideRotationBatch particles x d, householder above
  qr,           // per particle: QR of a Gaussian matrix, columns sign-fixed by diag(R)
  householder,  // product of random Householder reflections (Stewart 1980), O(d^2)
};
inline constexpr int64_t kWideRotationBatch = 4096;

// `method` with automatic resolved for a step of `particles` particles of dimension d.
RotationMethod resolve_rotation_method(RotationMethod method, int64_t particles, int32_t d);

// The rotations of one optimizer step: particle p's come from the Philox stream of
// (seed, step, p). Qr takes normals 0 .. d^2 - 1 (row-major into the Gaussian matrix),
// householder normals 0 .. d(d+1)/2 - 1 (reflection k takes the next d - k, the last one the
// sign of D), the plane rule block 0's first uniform.
struct RotationStream {
  uint64_t seed = 0;
  uint64_t step = 0;
};

// Fills `rotations` (count x d x d, row-major per particle) with the Haar rotations of
// particles [first, first + count) of `stream`. Any split of a step's particles into calls,
// on any threads, gives the same values; resolve automatic over the whole step first
// (resolve_rotation_method), or the choice follows this call's count. For every particle
// whose row of `bias` (count x d, optional) is nonzero, the first column of its rotation is
// that direction, normalised, and the rest is Haar on its orthogonal complement.
void draw_rotations(const RotationStream& stream, int64_t first, int64_t count, int32_t d,
                    RotationMethod method, std::span<double> rotations,
                    std::span<const double> bias = {});

}  // namespace polyprobe
