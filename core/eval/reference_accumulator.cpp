#include <polyprobe/accumulator.hpp>
#include <polyprobe/error.hpp>

namespace polyprobe {
namespace {

class ReferenceAccumulator final : public Accumulator {
 public:
  std::string name() const override { return "reference"; }
  void accumulate(std::span<const int64_t> keys, ConstMatrixRef<double> values,
                  MatrixRef<double> out) override {
    run(keys, values, out);
  }
  void accumulate(std::span<const int64_t> keys, ConstMatrixRef<float> values,
                  MatrixRef<float> out) override {
    run(keys, values, out);
  }

 private:
  template <class S>
  static void run(std::span<const int64_t> keys, ConstMatrixRef<S> values, MatrixRef<S> out) {
    if (values.rows() != static_cast<Eigen::Index>(keys.size()) || values.cols() != out.cols())
      throw Error("accumulate: " + std::to_string(keys.size()) + " keys, values " +
                  std::to_string(values.rows()) + " x " + std::to_string(values.cols()) + ", out " +
                  std::to_string(out.rows()) + " x " + std::to_string(out.cols()));
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const int64_t k = keys[i];
      if (k < 0 || k >= out.rows())
        throw Error("accumulate: key " + std::to_string(k) + " at " + std::to_string(i) +
                    " is outside [0, " + std::to_string(out.rows()) + ")");
      out.row(k) += values.row(static_cast<Eigen::Index>(i));
    }
  }
};

}  // namespace

std::string Accumulator::device_benchmark(int64_t, int64_t, int64_t, bool, int, uint64_t) {
  throw Error("accumulator '" + name() +
              "' works on host memory: it has no device to run a device benchmark on");
}

std::unique_ptr<Accumulator> make_reference_accumulator() {
  return std::make_unique<ReferenceAccumulator>();
}

}  // namespace polyprobe
