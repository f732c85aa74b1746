// What the host hands evaluators for the built-in layer kinds (plugin/ops.h): every typed
// attribute struct carries struct_size, the size of the struct this host sends, and the
// session options name their device by type and name.
#include <polyprobe/model.hpp>
#include <polyprobe/operations.hpp>

#include "plugin/plugin_impl.hpp"

#include <catch2/catch.hpp>

#include <map>
#include <string>

using namespace polyprobe;

namespace {

// The struct_size every op's attributes should carry.
const std::map<int32_t, uint32_t> kSizes = {{PP_OP_LINEAR, sizeof(pp_linear_attrs)},
                                            {PP_OP_ACTIVATION, sizeof(pp_activation_attrs)},
                                            {PP_OP_LAYER_NORM, sizeof(pp_layer_norm_attrs)},
                                            {PP_OP_CONV, sizeof(pp_conv_attrs)},
                                            {PP_OP_POOL, sizeof(pp_pool_attrs)},
                                            {PP_OP_SELF_ATTENTION, sizeof(pp_attention_attrs)},
                                            {PP_OP_MOE, sizeof(pp_moe_attrs)},
                                            {PP_OP_LIF, sizeof(pp_lif_attrs)},
                                            {PP_OP_CHERI_BLOCK, sizeof(pp_cheri_attrs)}};

// Every op struct starts with the size (the same offset in each).
uint32_t struct_size_of(const pp_layer_view& layer) {
  return *static_cast<const uint32_t*>(layer.op_attrs);
}

}  // namespace

TEST_CASE("the host sets struct_size in every ops.h struct it sends") {
  const LayerFactory factory = LayerFactory::with_builtins();
  Model sequence(Shape{{4, 8}});
  for (const auto& [kind, attrs] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"self_attention", {{"num_heads", 2}}},
                                                           {"cheri_block", {}},
                                                           {"layer_norm", {}},
                                                           {"lif", {}},
                                                           {"moe", {{"num_experts", 2}}},
                                                           {"flatten", {}},
                                                           {"linear", {{"out_features", 6}}},
                                                           {"gelu", {}},
                                                           {"relu", {}}})
    sequence.add(factory.create(kind, attrs, sequence.output_shape()));
  Model image(Shape{{1, 6, 6}});
  image.add(
      factory.create("conv2d", {{"out_channels", 2}, {"kernel_size", 3}}, image.output_shape()));
  image.add(factory.create("max_pool2d", {{"kernel_size", 2}}, image.output_shape()));
  image.add(factory.create("flatten", {}, image.output_shape()));

  std::map<int32_t, int> seen;
  for (const Model* model : {&sequence, &image}) {
    const detail::ModelView view(*model);
    REQUIRE(view.get()->struct_size == sizeof(pp_model_view));
    for (int32_t i = 0; i < view.get()->n_layers; ++i) {
      const pp_layer_view& layer = view.get()->layers[i];
      INFO(layer.kind);
      if (layer.op == PP_OP_FLATTEN) {
        CHECK(layer.op_attrs == nullptr);
        continue;
      }
      REQUIRE(layer.op != PP_OP_CUSTOM);
      REQUIRE(layer.op_attrs != nullptr);
      REQUIRE(kSizes.count(layer.op) == 1);
      CHECK(struct_size_of(layer) == kSizes.at(layer.op));
      ++seen[layer.op];
    }
  }
  // Every op that has attributes was checked.
  for (const auto& [op, size] : kSizes) {
    INFO("op " << op);
    CHECK(seen[op] > 0);
  }
}

TEST_CASE("session options carry the device's type and name") {
  const EvaluatorOptions options;
  const detail::DeviceRef accel{PP_DEVICE_TYPE_ACCELERATOR, "fakeaccel"};
  const pp_session_options o = detail::to_pp_options(options, accel);
  CHECK(o.struct_size == sizeof(pp_session_options));
  CHECK(o.device == PP_DEVICE_TYPE_ACCELERATOR);
  CHECK(std::string(o.device_name) == "fakeaccel");
  const detail::DeviceRef host;  // the default: the cpu
  const pp_session_options cpu = detail::to_pp_options(options, host);
  CHECK(cpu.device == PP_DEVICE_TYPE_CPU);
  CHECK(std::string(cpu.device_name) == "cpu");
}

TEST_CASE("a device is a type and a valid name and cpu is exactly the cpu type") {
  CHECK(device_name_of(PP_DEVICE_TYPE_CPU, nullptr) == "cpu");
  CHECK(device_name_of(PP_DEVICE_TYPE_CPU, "cpu") == "cpu");
  CHECK(device_name_of(PP_DEVICE_TYPE_GPU, "rocm") == "rocm");
  CHECK(device_name_of(PP_DEVICE_TYPE_ACCELERATOR, "fake_accel-2") == "fake_accel-2");
  CHECK(device_name_of(PP_DEVICE_TYPE_GPU, nullptr).empty());  // a device needs its name
  CHECK(device_name_of(PP_DEVICE_TYPE_GPU, "cpu").empty());
  CHECK(device_name_of(PP_DEVICE_TYPE_CPU, "cuda").empty());
  CHECK(device_name_of(PP_DEVICE_TYPE_GPU, "CUDA").empty());
  CHECK(device_name_of(PP_DEVICE_TYPE_GPU, "").empty());
  CHECK(device_name_of(PP_DEVICE_TYPE_GPU, std::string(33, 'a').c_str()).empty());
  CHECK(device_name_of(7, "npu").empty());
  CHECK(device_type_label(PP_DEVICE_TYPE_ACCELERATOR) == "accelerator");
  // The spellings of the two long-standing devices compare as their types.
  CHECK(PP_DEVICE_CPU == PP_DEVICE_TYPE_CPU);
  CHECK(PP_DEVICE_CUDA == PP_DEVICE_TYPE_GPU);
}

TEST_CASE("a session's find_operation resolves the cpu type and its own device's type") {
  auto table = std::make_shared<OperationTable>();
  static const int kTable = 0;
  const pp_operation cpu_op{sizeof(pp_operation),
                            "fixture_op",
                            PP_DEVICE_TYPE_CPU,
                            PP_DEVICE_NAME_CPU,
                            PP_DTYPE_BIT(PP_DTYPE_F32),
                            1,
                            "",
                            nullptr,
                            &kTable};
  const pp_operation accel_op{sizeof(pp_operation),
                              "fixture_op",
                              PP_DEVICE_TYPE_ACCELERATOR,
                              "fakeaccel",
                              PP_DTYPE_BIT(PP_DTYPE_F32),
                              1,
                              "",
                              nullptr,
                              &kTable};
  const pp_operation rocm_op{sizeof(pp_operation),
                             "fixture_op",
                             PP_DEVICE_TYPE_GPU,
                             "rocm",
                             PP_DTYPE_BIT(PP_DTYPE_F32),
                             1,
                             "",
                             nullptr,
                             &kTable};
  const pp_operation nameless{sizeof(pp_operation),
                              "fixture_op",
                              PP_DEVICE_TYPE_GPU,
                              nullptr,
                              PP_DTYPE_BIT(PP_DTYPE_F32),
                              1,
                              "",
                              nullptr,
                              &kTable};
  CHECK(table->add(&cpu_op, "a").empty());
  CHECK(table->add(&accel_op, "b").empty());
  CHECK(table->add(&rocm_op, "c").empty());
  CHECK_THAT(table->add(&nameless, "d"), Catch::Contains("no valid device"));
  CHECK(table->find("fixture_op", "fakeaccel", PP_DTYPE_F32)->op == &accel_op);
  CHECK(table->find("fixture_op", "cuda", PP_DTYPE_F32) == nullptr);

  const SessionOperations session(table, PP_DEVICE_TYPE_ACCELERATOR, "fakeaccel");
  const pp_host_api* host = session.host_api();
  CHECK(host->find_operation(host->ctx, "fixture_op", PP_DEVICE_TYPE_CPU, PP_DTYPE_F32) == &cpu_op);
  CHECK(host->find_operation(host->ctx, "fixture_op", PP_DEVICE_TYPE_ACCELERATOR, PP_DTYPE_F32) ==
        &accel_op);
  // Another device's type finds nothing: the session runs on its own device only.
  CHECK(host->find_operation(host->ctx, "fixture_op", PP_DEVICE_TYPE_GPU, PP_DTYPE_F32) == nullptr);
  CHECK(std::string(host->operation_provider(host->ctx, &accel_op)) == "b");
}
