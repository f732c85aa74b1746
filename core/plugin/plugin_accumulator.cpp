// An Accumulator backed by a plugin's accumulator API, and its selection.
#include "plugin/plugin_impl.hpp"

#include <polyprobe/accumulator.hpp>
#include <polyprobe/registry.hpp>

#include <cstddef>

namespace polyprobe::detail {
namespace {

class PluginAccumulator final : public Accumulator {
 public:
  PluginAccumulator(const pp_plugin* plugin, std::string strategy, int threads)
      : plugin_(plugin), strategy_(std::move(strategy)), threads_(threads) {}
  ~PluginAccumulator() override {
    for (auto& [self, api] : by_dtype_)
      if (self != nullptr) api->destroy(self);
  }
  PluginAccumulator(const PluginAccumulator&) = delete;
  PluginAccumulator& operator=(const PluginAccumulator&) = delete;

  std::string name() const override { return std::string(plugin_->name) + "/" + strategy_; }
  std::string last_strategy() const override { return last_.empty() ? strategy_ : last_; }
  void accumulate(std::span<const int64_t> keys, ConstMatrixRef<double> values,
                  MatrixRef<double> out) override {
    run(keys, values, out);
  }
  void accumulate(std::span<const int64_t> keys, ConstMatrixRef<float> values,
                  MatrixRef<float> out) override {
    run(keys, values, out);
  }

  std::string device_benchmark(int64_t n_keys, int64_t rows, int64_t width, bool single_precision,
                               int repeats, uint64_t seed) override {
    auto& [self, api] = instance(single_precision ? PP_DTYPE_F32 : PP_DTYPE_F64);
    if (api->struct_size < offsetof(pp_accumulator_api, device_benchmark) + sizeof(void*) ||
        api->device_benchmark == nullptr)
      return Accumulator::device_benchmark(n_keys, rows, width, single_precision, repeats, seed);
    const pp_accumulate_benchmark spec{
        sizeof(pp_accumulate_benchmark), n_keys, rows, width, repeats, seed};
    const char* json = nullptr;
    pp_error err{};
    if (api->device_benchmark(self, &spec, &json, &err) != PP_OK || json == nullptr)
      throw Error("plugin " + std::string(plugin_->name) + ": device benchmark of accumulator '" +
                  strategy_ + "' failed: " + error_text(err));
    return json;
  }

 private:
  // The plugin's accumulator for `dtype`, created on first use.
  std::pair<void*, const pp_accumulator_api*>& instance(int32_t dtype) {
    auto& slot = by_dtype_[dtype == PP_DTYPE_F32 ? 0 : 1];
    auto& [self, api] = slot;
    pp_error err{};
    if (self == nullptr) {
      if (plugin_->accumulator_create(strategy_.c_str(), dtype, &self, &api, &err) != PP_OK ||
          self == nullptr)
        throw Error("plugin " + std::string(plugin_->name) + ": cannot create accumulator '" +
                    strategy_ + "': " + error_text(err));
      if (api->struct_size >= offsetof(pp_accumulator_api, set_threads) + sizeof(void*) &&
          api->set_threads != nullptr && api->set_threads(self, threads_, &err) != PP_OK)
        throw Error("plugin " + std::string(plugin_->name) + ": " + error_text(err));
    }
    return slot;
  }

  template <class S>
  void run(std::span<const int64_t> keys, ConstMatrixRef<S> values, MatrixRef<S> out) {
    if (values.rows() != static_cast<Eigen::Index>(keys.size()) || values.cols() != out.cols())
      throw Error("accumulate: " + std::to_string(keys.size()) + " keys, values " +
                  std::to_string(values.rows()) + " x " + std::to_string(values.cols()) + ", out " +
                  std::to_string(out.rows()) + " x " + std::to_string(out.cols()));
    // The ABI takes contiguous row-major tensors; copy strided views.
    const bool contiguous =
        values.outerStride() == values.cols() && out.outerStride() == out.cols();
    Matrix<S> values_copy, out_copy;
    const S* v = values.data();
    S* o = out.data();
    if (!contiguous) {
      values_copy = values;
      out_copy = out;
      v = values_copy.data();
      o = out_copy.data();
    }
    const int32_t dtype = std::is_same_v<S, float> ? PP_DTYPE_F32 : PP_DTYPE_F64;
    auto& [self, api] = instance(dtype);
    pp_error err{};
    const int64_t v_shape[2] = {values.rows(), values.cols()},
                  o_shape[2] = {out.rows(), out.cols()};
    pp_tensor tv{const_cast<S*>(v), dtype, PP_DEVICE_TYPE_CPU, 0, 2, v_shape, nullptr};
    pp_tensor to{o, dtype, PP_DEVICE_TYPE_CPU, 0, 2, o_shape, nullptr};
    if (api->accumulate(self, static_cast<int64_t>(keys.size()), keys.data(), &tv, out.rows(), &to,
                        &err) != PP_OK)
      throw Error("plugin " + std::string(plugin_->name) +
                  " failed to accumulate: " + error_text(err));
    if (!contiguous) out = out_copy;
    if (api->struct_size >= offsetof(pp_accumulator_api, last_strategy) + sizeof(void*) &&
        api->last_strategy != nullptr)
      if (const char* used = api->last_strategy(self)) last_ = used;
  }

  const pp_plugin* plugin_;
  std::string strategy_;
  std::string last_;  // what the plugin reported for the last call
  int threads_;
  std::pair<void*, const pp_accumulator_api*> by_dtype_[2] = {{nullptr, nullptr},
                                                              {nullptr, nullptr}};
};

}  // namespace

std::unique_ptr<Accumulator> make_plugin_accumulator(const pp_plugin* plugin,
                                                     const std::string& strategy, int threads) {
  return std::make_unique<PluginAccumulator>(plugin, strategy, threads);
}

}  // namespace polyprobe::detail
