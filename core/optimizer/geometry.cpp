// Tight-frame templates and Haar rotations.
#include "vector_math.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/geometry.hpp>
#include <polyprobe/plugin/kernels/philox.hpp>
#include <polyprobe/plugin/kernels/plane_rotation.hpp>

#include <Eigen/LU>
#include <Eigen/QR>

#include <cmath>
#include <string>
#include <vector>

namespace polyprobe {

PolytopeKind parse_polytope(std::string_view name) {
  if (name == "simplex") return PolytopeKind::simplex;
  if (name == "orthoplex") return PolytopeKind::orthoplex;
  if (name == "cube") return PolytopeKind::cube;
  throw Error("unknown polytope '" + std::string(name) + "' (use simplex, orthoplex or cube)");
}

std::string_view to_string(PolytopeKind kind) {
  switch (kind) {
    case PolytopeKind::simplex:
      return "simplex";
    case PolytopeKind::orthoplex:
      return "orthoplex";
    case PolytopeKind::cube:
      return "cube";
  }
  return "?";
}

int64_t polytope_vertex_count(PolytopeKind kind, int32_t d) {
  switch (kind) {
    case PolytopeKind::simplex:
      return int64_t{d} + 1;
    case PolytopeKind::orthoplex:
      return 2 * int64_t{d};
    case PolytopeKind::cube:
      return int64_t{1} << d;
  }
  return 0;
}

Matrix<double> make_template(PolytopeKind kind, int32_t d) {
  if (d < 1) throw Error("polytope dimension must be at least 1, got " + std::to_string(d));
  if (kind == PolytopeKind::cube && d > 20)
    throw Error("a cube in dimension " + std::to_string(d) +
                " has 2^d vertices; use d <= 20 or the orthoplex");
  const auto vertices = polytope_vertex_count(kind, d);
  const double dd = d;
  Matrix<double> t = Matrix<double>::Zero(vertices, d);
  switch (kind) {
    case PolytopeKind::simplex: {
      // polystep: sqrt(1 + 1/d) I - (sqrt(d + 1) + 1) / d^1.5, plus the row 1/sqrt(d).
      const double shift = (std::sqrt(dd + 1) + 1) / std::pow(dd, 1.5);
      for (int32_t i = 0; i < d; ++i)
        for (int32_t j = 0; j < d; ++j) t(i, j) = (i == j ? std::sqrt(1 + 1 / dd) : 0.0) - shift;
      t.row(d).setConstant(1 / std::sqrt(dd));
      break;
    }
    case PolytopeKind::orthoplex:
      for (int32_t i = 0; i < d; ++i) {
        t(i, i) = 1;
        t(d + i, i) = -1;
      }
      break;
    case PolytopeKind::cube:
      for (int64_t v = 0; v < vertices; ++v)
        for (int32_t j = 0; j < d; ++j)
          t(v, j) = ((v >> (d - 1 - j)) & 1 ? 1.0 : -1.0) / std::sqrt(dd);
      break;
  }
  // Centre and normalise: exact for the orthoplex and cube, and removes the rounding of the
  // simplex construction so the tight-frame identities hold to machine precision.
  t.rowwise() -= t.colwise().mean();
  t.rowwise().normalize();
  return t;
}

namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic>;

// Negates the last column when det < 0, so the result is in SO(d) and, for a biased draw,
// the first column (the bias direction) is untouched.
void fix_determinant(
    Eigen::Map<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>& q,
    double det_sign) {
  if (det_sign < 0) q.col(q.cols() - 1) *= -1;
}

bool usable_bias(std::span<const double> bias, int64_t particle, int32_t d, double& norm) {
  if (bias.empty()) return false;
  norm = 0;
  for (int32_t j = 0; j < d; ++j) {
    const double b = bias[static_cast<std::size_t>(particle * d + j)];
    norm += b * b;
  }
  norm = std::sqrt(norm);
  return norm > 0 && std::isfinite(norm);
}

// Normal draws 0 .. out.size() - 1 of one particle's stream (kernels/philox.hpp).
void particle_normals(const RotationStream& stream, int64_t particle, std::span<double> out) {
  double pair[2];
  for (std::size_t j = 0; j < out.size(); j += 2) {
    kernels::particle_normal_pair(stream.seed, stream.step, static_cast<uint64_t>(particle),
                                  static_cast<uint32_t>(j / 2), pair);
    out[j] = pair[0];
    if (j + 1 < out.size()) out[j + 1] = pair[1];
  }
}

// SO(2) is the circle: a uniform angle is its Haar law, so one uniform (block 0 of the
// stream) and one cosine and sine replace a factorisation (kernels/plane_rotation.hpp, which a
// device backend computes too); they are taken for all of the call's particles in one vector
// pass (vector_math.hpp). A biased particle's rotation is fixed by its first column.
void draw_plane(const RotationStream& stream, int64_t first, int64_t count,
                std::span<double> rotations, std::span<const double> bias) {
  const auto n = static_cast<std::size_t>(count);
  std::vector<double> turns(n), c(n), s(n);
  for (std::size_t p = 0; p < n; ++p) {
    turns[p] =
        kernels::plane_rotation_turn(stream.seed, stream.step, static_cast<uint64_t>(first) + p);
  }
  detail::cos_sin_turns(turns.data(), c.data(), s.data(), count);
  for (int64_t p = 0; p < count; ++p) {
    const auto i = static_cast<std::size_t>(p);
    if (double norm = 0; usable_bias(bias, p, 2, norm)) {
      c[i] = bias[static_cast<std::size_t>(p * 2)] / norm;
      s[i] = bias[static_cast<std::size_t>(p * 2 + 1)] / norm;
    }
    double* q = rotations.data() + p * 4;
    q[0] = c[i];
    q[1] = -s[i];
    q[2] = s[i];
    q[3] = c[i];
  }
}

void draw_qr(const RotationStream& stream, int64_t first, int64_t count, int32_t d,
             std::span<double> rotations, std::span<const double> bias) {
  // One factorisation and one Q reused for every particle: no allocation per rotation.
  MatD g(d, d), q(d, d);
  Eigen::HouseholderQR<MatD> qr(d, d);
  std::vector<double> normals(static_cast<std::size_t>(d) * static_cast<std::size_t>(d));
  for (int64_t p = 0; p < count; ++p) {
    particle_normals(stream, first + p, normals);
    for (int32_t i = 0; i < d; ++i)
      for (int32_t j = 0; j < d; ++j)
        g(i, j) = normals[static_cast<std::size_t>(i) * static_cast<std::size_t>(d) +
                          static_cast<std::size_t>(j)];
    double norm = 0;
    if (usable_bias(bias, p, d, norm))
      for (int32_t i = 0; i < d; ++i) g(i, 0) = bias[static_cast<std::size_t>(p * d + i)] / norm;
    qr.compute(g);
    q = qr.householderQ();
    const MatD& r = qr.matrixQR();
    for (int32_t j = 0; j < d; ++j)
      if (r(j, j) < 0) q.col(j) *= -1;
    Eigen::Map<Matrix<double>> out(rotations.data() + p * d * d, d, d);
    out = q;
    fix_determinant(out, q.determinant());
  }
}

// Stewart (1980): Q = H_0 H_1 ... H_{d-2} D, each H_k a Householder reflection on
// coordinates k..d-1 built from a fresh Gaussian vector, D the signs that make the
// equivalent QR factor's diagonal positive. O(d^2) per rotation instead of O(d^3).
void draw_householder(const RotationStream& stream, int64_t first, int64_t count, int32_t d,
                      std::span<double> rotations, std::span<const double> bias) {
  std::vector<double> x(static_cast<std::size_t>(d));
  std::vector<double> normals(static_cast<std::size_t>(d * (d + 1) / 2));
  for (int64_t p = 0; p < count; ++p) {
    particle_normals(stream, first + p, normals);
    Eigen::Map<Matrix<double>> q(rotations.data() + p * d * d, d, d);
    q.setIdentity();
    double det_sign = 1;
    std::size_t next = 0;
    double bias_norm = 0;
    const bool biased = usable_bias(bias, p, d, bias_norm);
    for (int32_t k = 0; k + 1 < d; ++k) {
      const int32_t m = d - k;
      for (int32_t i = 0; i < m; ++i) x[static_cast<std::size_t>(i)] = normals[next++];
      if (k == 0 && biased)
        for (int32_t i = 0; i < d; ++i)
          x[static_cast<std::size_t>(i)] = bias[static_cast<std::size_t>(p * d + i)];
      double norm2 = 0;
      for (int32_t i = 0; i < m; ++i)
        norm2 += x[static_cast<std::size_t>(i)] * x[static_cast<std::size_t>(i)];
      const double norm = std::sqrt(norm2);
      const double s = x[0] >= 0 ? 1.0 : -1.0;
      // u = x + s |x| e_0; H = I - 2 u u^T / |u|^2 maps x to -s |x| e_0.
      x[0] += s * norm;
      double u2 = 0;
      for (int32_t i = 0; i < m; ++i)
        u2 += x[static_cast<std::size_t>(i)] * x[static_cast<std::size_t>(i)];
      // Q[:, k:] <- Q[:, k:] H; then multiply column k by D_k = -s.
      if (u2 > 0) {
        for (int32_t r = 0; r < d; ++r) {
          double dot = 0;
          for (int32_t i = 0; i < m; ++i) dot += q(r, k + i) * x[static_cast<std::size_t>(i)];
          const double f = 2 * dot / u2;
          for (int32_t i = 0; i < m; ++i) q(r, k + i) -= f * x[static_cast<std::size_t>(i)];
        }
        det_sign = -det_sign;
      }
      if (s > 0) {
        q.col(k) *= -1;
        det_sign = -det_sign;
      }
    }
    // The last sign of D: a fair coin from the last normal.
    if (normals[next] < 0) {
      q.col(d - 1) *= -1;
      det_sign = -det_sign;
    }
    fix_determinant(q, det_sign);
  }
}

}  // namespace

RotationMethod resolve_rotation_method(RotationMethod method, int64_t particles, int32_t d) {
  if (method != RotationMethod::automatic) return method;
  return particles * d >= kWideRotationBatch ? RotationMethod::householder : RotationMethod::qr;
}

void draw_rotations(const RotationStream& stream, int64_t first, int64_t count, int32_t d,
                    RotationMethod method, std::span<double> rotations,
                    std::span<const double> bias) {
  if (d < 1) throw Error("rotation dimension must be at least 1, got " + std::to_string(d));
  if (first < 0 || count < 0)
    throw Error("draw_rotations: particles [" + std::to_string(first) + ", " +
                std::to_string(first + count) + ") is not a range of particles");
  if (static_cast<int64_t>(rotations.size()) != count * d * d)
    throw Error("draw_rotations: the output holds " + std::to_string(rotations.size()) +
                " values, not count * d * d = " + std::to_string(count * d * d));
  if (!bias.empty() && static_cast<int64_t>(bias.size()) != count * d)
    throw Error("draw_rotations: the bias holds " + std::to_string(bias.size()) +
                " values, not count * d = " + std::to_string(count * d));
  if (d == 1) {
    std::fill(rotations.begin(), rotations.end(), 1.0);  // SO(1) = {1}
    return;
  }
  if (d == 2) {
    draw_plane(stream, first, count, rotations, bias);
    return;
  }
  if (resolve_rotation_method(method, count, d) == RotationMethod::qr)
    draw_qr(stream, first, count, d, rotations, bias);
  else
    draw_householder(stream, first, count, d, rotations, bias);
}

}  // namespace polyprobe
