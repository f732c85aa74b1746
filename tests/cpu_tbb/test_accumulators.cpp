// The cpu_tbb accumulators against the core's reference.
#include "cpu_tbb/cpu_tbb_fixture.hpp"

#include <polyprobe/accumulator.hpp>

#include <tuple>

namespace polyprobe::test {
namespace {

template <class S>
void check_strategy(const std::string& strategy, int64_t width) {
  std::mt19937_64 rng(7);
  const int64_t n = 20000, n_keys = 997;
  std::vector<int64_t> keys(static_cast<std::size_t>(n));
  for (auto& k : keys) k = static_cast<int64_t>(rng() % static_cast<uint64_t>(n_keys));
  const Matrix<S> values = Matrix<S>::Random(n, width);
  Matrix<S> expect = Matrix<S>::Zero(n_keys, width);
  make_reference_accumulator()->accumulate(keys, values, expect);
  for (const int threads : {1, 2}) {
    auto acc = cpu_registry().make_accumulator("cpu_tbb", strategy, threads);
    Matrix<S> got = Matrix<S>::Ones(n_keys, width);
    acc->accumulate(keys, values, got);
    got.array() -= S(1);
    const double tol = std::is_same_v<S, float> ? 1e-4 : 1e-12;
    CHECK((got - expect).cwiseAbs().maxCoeff() <= tol * (1.0 + expect.cwiseAbs().maxCoeff()));
  }
}

TEST_CASE("cpu_tbb accumulators agree with the reference", "[cpu_tbb][accumulator]") {
  for (const std::string strategy : {"sequential", "scatter", "segment", "auto"})
    for (const int64_t width : {1, 3, 64}) {
      INFO(strategy << ", width " << width);
      check_strategy<double>(strategy, width);
      check_strategy<float>(strategy, width);
    }
}

TEST_CASE("cpu_tbb sequential, segment and auto give the reference's bits for any thread count",
          "[cpu_tbb][accumulator]") {
  std::mt19937_64 rng(9);
  const int64_t n = 50000, n_keys = 101;
  std::vector<int64_t> keys(static_cast<std::size_t>(n));
  for (auto& k : keys) k = static_cast<int64_t>(rng() % static_cast<uint64_t>(n_keys));
  const Matrix<float> values = Matrix<float>::Random(n, 3);
  // A non-zero start, so "add to the row in input order" is what is tested.
  const Matrix<float> start = Matrix<float>::Random(n_keys, 3);
  Matrix<float> expect = start;
  make_reference_accumulator()->accumulate(keys, values, expect);
  for (const std::string strategy : {"sequential", "segment", "auto"})
    for (const int threads : {1, 2, 3, 4, 8}) {
      INFO(strategy << ", " << threads << " threads");
      Matrix<float> got = start;
      auto acc = cpu_registry().make_accumulator("cpu_tbb", strategy, threads);
      acc->accumulate(keys, values, got);
      CHECK(got == expect);
    }
}

TEST_CASE("cpu_tbb auto takes sequential on few threads or narrow rows, else segment",
          "[cpu_tbb][accumulator]") {
  const std::vector<int64_t> keys{0, 1, 0, 2};
  for (const auto& [threads, width, expect] :
       {std::tuple{1, 64, "sequential"}, std::tuple{2, 64, "sequential"},
        std::tuple{4, 64, "segment"}, std::tuple{8, 16, "segment"}, std::tuple{8, 3, "sequential"},
        std::tuple{16, 15, "sequential"}}) {
    INFO(threads << " threads, width " << width);
    auto acc = cpu_registry().make_accumulator("cpu_tbb", "auto", threads);
    const Matrix<float> values = Matrix<float>::Ones(4, width);
    Matrix<float> out = Matrix<float>::Zero(3, width);
    acc->accumulate(keys, values, out);
    CHECK(acc->last_strategy() == expect);
    CHECK(out(0, 0) == 2.0f);
  }
}

TEST_CASE("an unknown accumulator strategy is an error", "[cpu_tbb][accumulator]") {
  CHECK_THROWS_WITH(cpu_registry().make_accumulator("cpu_tbb", "telepathy"),
                    Catch::Contains("telepathy"));
}

}  // namespace
}  // namespace polyprobe::test
