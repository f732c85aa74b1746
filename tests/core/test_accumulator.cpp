#include <polyprobe/accumulator.hpp>
#include <polyprobe/candidates.hpp>
#include <polyprobe/error.hpp>

#include <catch2/catch.hpp>

#include <random>

using namespace polyprobe;

TEST_CASE("the reference accumulator sums rows by key") {
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<int64_t> key(0, 9);
  std::vector<int64_t> keys(200);
  for (auto& k : keys) k = key(rng);
  const Matrix<double> values = Matrix<double>::Random(200, 3);
  Matrix<double> out = Matrix<double>::Ones(10, 3);
  make_reference_accumulator()->accumulate(keys, values, out);
  Matrix<double> want = Matrix<double>::Ones(10, 3);
  for (std::size_t i = 0; i < keys.size(); ++i)
    want.row(keys[i]) += values.row(static_cast<Eigen::Index>(i));
  CHECK((out - want).cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("the accumulator rejects keys out of range and mismatched shapes") {
  auto acc = make_reference_accumulator();
  const Matrix<float> values = Matrix<float>::Ones(2, 2);
  Matrix<float> out = Matrix<float>::Zero(3, 2);
  const std::vector<int64_t> bad = {0, 3};
  CHECK_THROWS_WITH(acc->accumulate(bad, values, out), Catch::Contains("key 3"));
  const std::vector<int64_t> short_keys = {0};
  CHECK_THROWS_AS(acc->accumulate(short_keys, values, out), Error);
}

TEST_CASE("particle maps pad the last particle and validate coordinates") {
  const ParticleMap m = ParticleMap::contiguous(5, 2);
  CHECK(m.count() == 3);
  CHECK(m.coords == std::vector<int64_t>{0, 1, 2, 3, 4, -1});
  CHECK_NOTHROW(m.validate(5));
  CHECK_THROWS_WITH(m.validate(4), Catch::Contains("coordinate 4"));
  ParticleMap twice{2, {0, 1, 1, -1}};
  CHECK_THROWS_WITH(twice.validate(3), Catch::Contains("belongs to two particles"));
  CHECK_THROWS_AS(ParticleMap::contiguous(5, 0), Error);
}
