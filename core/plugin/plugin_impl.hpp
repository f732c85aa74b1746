// Internal pieces of the plugin host: views of core objects in ABI form, and adapters
// that present plugin objects as core interfaces.
#pragma once

#include <polyprobe/plugin/abi.h>
#include <polyprobe/error.hpp>
#include <polyprobe/evaluator.hpp>
#include <polyprobe/layer.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/model.hpp>
#include <polyprobe/operations.hpp>
#include <polyprobe/subspace.hpp>

#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace polyprobe {
class Accumulator;
class RadiusModel;
struct SubspaceSettings;
}  // namespace polyprobe

namespace polyprobe::detail {

std::string dtype_label(int32_t dtype);
std::string component_label(int32_t component);
int32_t to_pp_dtype(DType dtype);
std::string error_text(const pp_error& err);

// The typed attributes of one built-in layer (ops.h), whichever its op is.
union OpAttrs {
  pp_linear_attrs linear;
  pp_activation_attrs activation;
  pp_layer_norm_attrs layer_norm;
  pp_conv_attrs conv;
  pp_pool_attrs pool;
  pp_attention_attrs attention;
  pp_moe_attrs moe;
  pp_lif_attrs lif;
  pp_cheri_attrs cheri;
};
// The op of a built-in layer kind and its attributes, read from the layer's own
// description (kind, attributes, shapes); PP_OP_CUSTOM for any other kind.
int32_t describe_op(const Layer& layer, OpAttrs& attrs);

// A pp_model_view of a Model, with storage for everything its pointers reference (the
// typed operations of the built-in kinds included). It stays valid as long as this object
// and the model's layers live.
class ModelView {
 public:
  explicit ModelView(const Model& model);
  ModelView(const ModelView&) = delete;
  ModelView& operator=(const ModelView&) = delete;
  const pp_model_view* get() const { return &view_; }

 private:
  std::deque<std::string> strings_;
  std::deque<std::vector<int64_t>> shapes_;
  std::deque<OpAttrs> attrs_;
  std::vector<pp_layer_view> layers_;
  pp_model_view view_{};
};

// A pp_loss_view of a Loss (valid while the loss lives).
struct LossView {
  explicit LossView(const Loss& loss);
  LossView(const LossView&) = delete;
  LossView& operator=(const LossView&) = delete;
  std::string name;
  pp_loss_view view{};
};

// A pp_subspace_view of a rank-one subspace (valid while the subspace lives). `get()` is
// null when there is no subspace; `reason` says why a subspace cannot be shown to plugins.
class SubspaceView {
 public:
  explicit SubspaceView(const Subspace* subspace);
  SubspaceView(const SubspaceView&) = delete;
  SubspaceView& operator=(const SubspaceView&) = delete;
  const pp_subspace_view* get() const { return has_view_ ? &view_ : nullptr; }
  const std::string& reason() const { return reason_; }

 private:
  std::string kind_, reason_;
  std::vector<pp_subspace_coord> coords_;
  pp_subspace_view view_{};
  bool has_view_ = false;
};

// A Layer whose implementation lives in a plugin.
std::shared_ptr<const Layer> make_plugin_layer(const pp_layer_kind* kind, const std::string& plugin,
                                               const nlohmann::json& attrs, const Shape& input);

// A device as a session is created for: its pp_device_type and its name.
struct DeviceRef {
  int32_t type = PP_DEVICE_TYPE_CPU;
  std::string name = PP_DEVICE_NAME_CPU;
};

// An Evaluator whose session lives in a plugin, on `device`.
std::unique_ptr<Evaluator> make_plugin_evaluator(
    const pp_plugin* plugin, const Model& model, const Loss& loss, const EvaluatorOptions& options,
    const DeviceRef& device, const Subspace* subspace = nullptr, const std::string& path = {},
    std::shared_ptr<const OperationTable> operations = {});

// An Accumulator whose implementation lives in a plugin (created on first use per dtype).
std::unique_ptr<Accumulator> make_plugin_accumulator(const pp_plugin* plugin,
                                                     const std::string& strategy, int threads);

// A Subspace created by a plugin's subspace kind for `model` (throws with the plugin's
// reason when it refuses the model).
std::unique_ptr<Subspace> make_plugin_subspace(const pp_subspace_kind* kind,
                                               const std::string& plugin, const Model& model,
                                               const SubspaceSettings& settings);

// A RadiusModel whose controller is a plugin's (throws with the plugin's reason when it
// refuses `config`).
std::unique_ptr<RadiusModel> make_plugin_radius_model(const pp_radius_model_kind* kind,
                                                      const std::string& plugin,
                                                      const pp_radius_config& config);

// The ABI options; `device`, `subspace` and `path` (may be null) must outlive their use.
pp_session_options to_pp_options(const EvaluatorOptions& options, const DeviceRef& device,
                                 const pp_subspace_view* subspace = nullptr,
                                 const char* path = nullptr, const pp_host_api* host = nullptr);

}  // namespace polyprobe::detail
