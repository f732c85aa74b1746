// An Evaluator backed by a plugin's evaluator API.
#include "plugin/plugin_impl.hpp"

#include <nlohmann/json.hpp>

namespace polyprobe::detail {
namespace {

class PluginEvaluator final : public Evaluator {
 public:
  PluginEvaluator(const pp_plugin* plugin, const Model& model, const Loss& loss,
                  const EvaluatorOptions& options, const Subspace* subspace, std::string path)
      : plugin_(plugin),
        model_(model),
        loss_(loss),
        model_view_(model),
        loss_view_(loss),
        subspace_view_(subspace),
        path_(std::move(path)) {
    if (subspace != nullptr && subspace_view_.get() == nullptr)
      throw Error("plugin " + std::string(plugin_->name) + ": " + subspace_view_.reason());
    const pp_eval_options opts = to_pp_options(options, PP_DEVICE_CPU, subspace_view_.get(),
                                               path_.empty() ? nullptr : path_.c_str());
    pp_error err{};
    if (plugin_->evaluator_create(nullptr, model_view_.get(), &loss_view_.view, &opts, &self_,
                                  &api_, &err) != PP_OK ||
        self_ == nullptr || api_ == nullptr)
      throw Error("plugin " + std::string(plugin_->name) +
                  ": cannot create an evaluator: " + error_text(err));
  }
  ~PluginEvaluator() override { api_->destroy(self_); }
  PluginEvaluator(const PluginEvaluator&) = delete;
  PluginEvaluator& operator=(const PluginEvaluator&) = delete;

  std::string name() const override { return plugin_->name; }

  void register_batch(const Batch& batch) override {
    if (batch.inputs.cols() != model_.input_shape().numel())
      throw Error("batch inputs have " + std::to_string(batch.inputs.cols()) +
                  " features, the model expects " + std::to_string(model_.input_shape().numel()));
    loss_.check_targets(batch.targets, model_.output_shape().numel());
    batch_ = batch;  // the plugin may keep pointers into it until the next registration
    input_shape_ = {batch_.inputs.rows(), batch_.inputs.cols()};
    label_shape_ = {static_cast<int64_t>(batch_.targets.labels.size())};
    target_shape_ = {batch_.targets.values.rows(), batch_.targets.values.cols()};
    pp_batch_view view{};
    view.struct_size = sizeof(view);
    view.inputs = {batch_.inputs.data(), PP_DTYPE_F64, PP_DEVICE_CPU, 0, 2,
                   input_shape_.data(),  nullptr};
    if (batch_.targets.is_classification())
      view.labels = {batch_.targets.labels.data(), PP_DTYPE_I64, PP_DEVICE_CPU, 0, 1,
                     label_shape_.data(),          nullptr};
    else
      view.targets = {batch_.targets.values.data(), PP_DTYPE_F64, PP_DEVICE_CPU, 0, 2,
                      target_shape_.data(),         nullptr};
    check(api_->register_batch(self_, &view, &err_), "register a batch");
  }

  double evaluate_base(std::span<const double> base) override {
    double loss = 0.0;
    const ParticleMap none;
    pp_candidates c = describe(base, none, {}, {});
    check(api_->evaluate(self_, &c, &loss, &err_), "evaluate the base parameters");
    return loss;
  }

  void evaluate(std::span<const double> base, const CandidateSet& set,
                std::span<double> losses) override {
    set.validate();
    if (static_cast<int64_t>(losses.size()) != set.size())
      throw Error("loss buffer holds " + std::to_string(losses.size()) + " values for " +
                  std::to_string(set.size()) + " candidates");
    pp_candidates c = describe(base, *set.particles, set.particle, set.displacement);
    check(api_->evaluate(self_, &c, losses.data(), &err_), "evaluate candidates");
  }

  nlohmann::json explain() const override {
    nlohmann::json j = {{"evaluator", plugin_->name}};
    if (api_->explain != nullptr) {
      const char* text = api_->explain(self_);
      if (text != nullptr) j["plugin"] = nlohmann::json::parse(text, nullptr, false);
    }
    return j;
  }

 private:
  pp_candidates describe(std::span<const double> base, const ParticleMap& particles,
                         std::span<const int64_t> particle,
                         std::span<const double> displacement) const {
    if (static_cast<int64_t>(base.size()) != model_.num_parameters())
      throw Error("base parameter vector has " + std::to_string(base.size()) +
                  " entries, the model has " + std::to_string(model_.num_parameters()));
    pp_candidates c{};
    c.struct_size = sizeof(c);
    c.count = static_cast<int64_t>(particle.size());
    c.d = particles.d;
    c.particle = particle.data();
    c.displacement = displacement.data();
    c.n_particles = particles.count();
    c.coords = particles.coords.data();
    c.base_params = base.data();
    c.n_params = static_cast<int64_t>(base.size());
    return c;
  }
  void check(int status, const char* what) {
    if (status != PP_OK)
      throw Error("plugin " + std::string(plugin_->name) + " failed to " + what + ": " +
                  error_text(err_));
  }

  const pp_plugin* plugin_;
  const Model& model_;
  const Loss& loss_;
  ModelView model_view_;
  LossView loss_view_;
  SubspaceView subspace_view_;
  std::string path_;
  void* self_ = nullptr;
  const pp_evaluator_api* api_ = nullptr;
  Batch batch_;
  std::vector<int64_t> input_shape_, label_shape_, target_shape_;
  pp_error err_{};
};

}  // namespace

pp_eval_options to_pp_options(const EvaluatorOptions& options, int32_t device,
                              const pp_subspace_view* subspace, const char* path) {
  pp_eval_options o{};
  o.struct_size = sizeof(o);
  o.dtype = to_pp_dtype(options.dtype);
  o.device = device;
  o.threads = options.threads;
  o.chunk_size = options.chunk_size;
  o.subspace = subspace;
  o.path = path;
  return o;
}

std::unique_ptr<Evaluator> make_plugin_evaluator(const pp_plugin* plugin, const Model& model,
                                                 const Loss& loss, const EvaluatorOptions& options,
                                                 const Subspace* subspace,
                                                 const std::string& path) {
  return std::make_unique<PluginEvaluator>(plugin, model, loss, options, subspace, path);
}

}  // namespace polyprobe::detail
