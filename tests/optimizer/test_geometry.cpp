// Templates are centred unit tight frames; rotations are orthogonal, in SO(d), Haar.
#include <catch2/catch.hpp>

#include <polyprobe/geometry.hpp>
#include <polyprobe/plugin/kernels/philox.hpp>

#include <Eigen/LU>

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

using namespace polyprobe;

TEST_CASE("templates are centred unit-radius tight frames", "[optimizer][geometry]") {
  for (PolytopeKind kind : {PolytopeKind::simplex, PolytopeKind::orthoplex, PolytopeKind::cube})
    for (int32_t d : {1, 2, 3, 5, 8}) {
      if (kind == PolytopeKind::cube && d > 6) continue;
      const Matrix<double> t = make_template(kind, d);
      INFO(to_string(kind) << " d=" << d);
      REQUIRE(t.rows() == polytope_vertex_count(kind, d));
      REQUIRE(t.colwise().sum().cwiseAbs().maxCoeff() < 1e-12);
      REQUIRE((t.rowwise().norm().array() - 1).abs().maxCoeff() < 1e-12);
      const Eigen::MatrixXd frame = t.transpose() * t;
      const double expected = static_cast<double>(t.rows()) / d;
      REQUIRE((frame - expected * Eigen::MatrixXd::Identity(d, d)).cwiseAbs().maxCoeff() < 1e-12);
    }
  // The simplex's vertices are equiangular: t_v . t_w = -1/d.
  const Matrix<double> s = make_template(PolytopeKind::simplex, 4);
  const Eigen::MatrixXd gram = s * s.transpose();
  for (int v = 0; v < 5; ++v)
    for (int w = 0; w < 5; ++w) REQUIRE(std::abs(gram(v, w) - (v == w ? 1.0 : -0.25)) < 1e-12);
}

TEST_CASE("rotations are orthogonal with determinant one", "[optimizer][geometry]") {
  for (RotationMethod method : {RotationMethod::qr, RotationMethod::householder})
    for (int32_t d : {2, 3, 4, 7}) {
      const int64_t count = 50;
      std::vector<double> r(static_cast<std::size_t>(count * d * d));
      draw_rotations(RotationStream{7, static_cast<uint64_t>(d)}, 0, count, d, method, r);
      for (int64_t p = 0; p < count; ++p) {
        Eigen::Map<const Matrix<double>> q(r.data() + p * d * d, d, d);
        REQUIRE((q.transpose() * q - Eigen::MatrixXd::Identity(d, d)).cwiseAbs().maxCoeff() <
                1e-12);
        REQUIRE(std::abs(Eigen::MatrixXd(q).determinant() - 1) < 1e-12);
      }
    }
}

// Haar on SO(d): for d >= 3, E[tr R] = 0 and E[tr(R)^2] = 1; on SO(2) the angle is uniform.
TEST_CASE("rotations are Haar distributed", "[optimizer][geometry]") {
  const int64_t count = 20000;
  const double n = static_cast<double>(count);
  for (RotationMethod method : {RotationMethod::qr, RotationMethod::householder}) {
    const uint64_t seed = 11 + static_cast<uint64_t>(method);
    for (int32_t d : {3, 4}) {
      std::vector<double> r(static_cast<std::size_t>(count * d * d));
      draw_rotations(RotationStream{seed, static_cast<uint64_t>(d)}, 0, count, d, method, r);
      double m1 = 0, m2 = 0, entry = 0;
      for (int64_t p = 0; p < count; ++p) {
        Eigen::Map<const Matrix<double>> q(r.data() + p * d * d, d, d);
        const double tr = q.trace();
        m1 += tr;
        m2 += tr * tr;
        entry += q(0, 1) * q(0, 1);
      }
      m1 /= n;
      m2 /= n;
      entry /= n;
      INFO("method " << static_cast<int>(method) << " d=" << d);
      // Standard errors: sd(tr) = 1, sd(tr^2) about sqrt(2); 5 sigma bounds.
      REQUIRE(std::abs(m1) < 5.0 / std::sqrt(n));
      REQUIRE(std::abs(m2 - 1) < 5.0 * 1.5 / std::sqrt(n));
      REQUIRE(std::abs(entry - 1.0 / d) < 0.02);  // E[R_ij^2] = 1/d
    }
    // SO(2): Kolmogorov-Smirnov on the angle against the uniform law.
    std::vector<double> r(static_cast<std::size_t>(count * 4));
    draw_rotations(RotationStream{seed, 2}, 0, count, 2, method, r);
    std::vector<double> u(static_cast<std::size_t>(count));
    for (int64_t p = 0; p < count; ++p)
      u[static_cast<std::size_t>(p)] =
          (std::atan2(r[static_cast<std::size_t>(p * 4 + 2)], r[static_cast<std::size_t>(p * 4)]) +
           std::numbers::pi) /
          (2 * std::numbers::pi);
    std::sort(u.begin(), u.end());
    double ks = 0;
    for (std::size_t i = 0; i < u.size(); ++i)
      ks = std::max({ks, std::abs(u[i] - static_cast<double>(i) / n),
                     std::abs(u[i] - static_cast<double>(i + 1) / n)});
    REQUIRE(ks * std::sqrt(n) < 1.95);  // 0.1% critical value of the KS statistic
  }
}

TEST_CASE("biased rotations put the bias direction first", "[optimizer][geometry]") {
  std::mt19937_64 rng(3);
  const int32_t d = 5;
  const int64_t count = 4;
  std::vector<double> bias(count * d);
  std::normal_distribution<double> normal;
  for (double& b : bias) b = normal(rng);
  std::fill(bias.begin() + 2 * d, bias.begin() + 3 * d, 0.0);  // a zero bias stays Haar
  for (RotationMethod method : {RotationMethod::qr, RotationMethod::householder}) {
    std::vector<double> r(static_cast<std::size_t>(count * d * d));
    draw_rotations(RotationStream{3, 0}, 0, count, d, method, r, bias);
    for (int64_t p = 0; p < count; ++p) {
      Eigen::Map<const Matrix<double>> q(r.data() + p * d * d, d, d);
      REQUIRE(std::abs(Eigen::MatrixXd(q).determinant() - 1) < 1e-12);
      if (p == 2) continue;
      Eigen::Map<const Eigen::VectorXd> b(bias.data() + p * d, d);
      REQUIRE((q.col(0) - b.normalized()).cwiseAbs().maxCoeff() < 1e-12);
    }
  }
}

// Random123's known-answer vectors for Philox4x32-10 (kat_vectors): the stream is the
// published generator, so another backend (a CUDA kernel) can be checked against the same.
TEST_CASE("the counter-based generator is Philox4x32-10", "[optimizer][geometry]") {
  using kernels::philox4x32_10;
  using kernels::PhiloxWords;
  auto same = [](PhiloxWords a, std::array<uint32_t, 4> b) {
    return a.w[0] == b[0] && a.w[1] == b[1] && a.w[2] == b[2] && a.w[3] == b[3];
  };
  REQUIRE(same(philox4x32_10(PhiloxWords{{0, 0, 0, 0}}, 0, 0),
               {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  REQUIRE(same(philox4x32_10(PhiloxWords{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
                             0xffffffff, 0xffffffff),
               {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  REQUIRE(same(philox4x32_10(PhiloxWords{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
                             0xa4093822, 0x299f31d0),
               {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST_CASE("a particle's rotation depends on (seed, step, particle) alone",
          "[optimizer][geometry]") {
  for (RotationMethod method : {RotationMethod::qr, RotationMethod::householder})
    for (int32_t d : {2, 3, 5}) {
      INFO("method " << static_cast<int>(method) << " d=" << d);
      const int64_t count = 300;
      const auto dd = static_cast<std::size_t>(d * d);
      const RotationStream stream{42, 7};
      std::vector<double> whole(count * dd), pieces(count * dd), other(count * dd);
      draw_rotations(stream, 0, count, d, method, whole);
      // Any split into calls, in any order, gives the same rotations.
      for (auto [first, n] : {std::pair<int64_t, int64_t>{250, 50}, {0, 1}, {1, 249}})
        draw_rotations(stream, first, n, d, method,
                       std::span<double>(pieces).subspan(static_cast<std::size_t>(first) * dd,
                                                         static_cast<std::size_t>(n) * dd));
      REQUIRE(whole == pieces);
      // Another step or seed draws other rotations, for every particle.
      for (const RotationStream s : {RotationStream{42, 8}, RotationStream{43, 7}}) {
        draw_rotations(s, 0, count, d, method, other);
        for (int64_t p = 0; p < count; ++p)
          REQUIRE_FALSE(std::equal(whole.begin() + p * d * d, whole.begin() + (p + 1) * d * d,
                                   other.begin() + p * d * d));
      }
    }
}

TEST_CASE("biased plane rotations put the bias direction first", "[optimizer][geometry]") {
  const std::vector<double> bias{3, -4, 0, 0, -1, 0};
  std::vector<double> r(12);
  draw_rotations(RotationStream{1, 1}, 0, 3, 2, RotationMethod::automatic, r, bias);
  for (int p = 0; p < 3; ++p) {
    Eigen::Map<const Matrix<double>> q(r.data() + p * 4, 2, 2);
    REQUIRE(std::abs(Eigen::MatrixXd(q).determinant() - 1) < 1e-12);
    REQUIRE((q.transpose() * q - Eigen::MatrixXd::Identity(2, 2)).cwiseAbs().maxCoeff() < 1e-12);
  }
  REQUIRE(r[0] == Approx(0.6));
  REQUIRE(r[2] == Approx(-0.8));
  REQUIRE(r[8] == Approx(-1.0));
  REQUIRE(r[10] == Approx(0.0).margin(1e-15));
}
