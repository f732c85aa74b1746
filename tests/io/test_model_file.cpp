// JSON model files: round trips, and bad files refused with the line or the layer named.
#include "io/temp_dir.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/model_file.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace polyprobe {

TEST_CASE("a model file round-trips", "[io][model_file]") {
  testing::TempDir dir;
  const auto factory = LayerFactory::with_builtins();
  const ModelFile f = parse_model_file(
      R"({"polyprobe_model": 1, "input_shape": [1, 8, 8], "dtype": "float64", "loss": "hinge",
          "l2": 0.5, "layers": [{"kind": "conv2d", "out_channels": 2, "kernel_size": 3},
          {"kind": "relu"}, {"kind": "flatten"}, {"kind": "linear", "out_features": 10,
          "weight_transform": "int8"}]})",
      "m.json", factory);
  CHECK(f.model.dtype() == DType::f64);
  CHECK(f.loss == "hinge");
  CHECK(f.l2 == 0.5);
  CHECK(f.model.output_shape() == Shape{{10}});
  write_model_file(dir / "copy.json", f.model, f.loss, f.l2);
  const ModelFile g = read_model_file(dir / "copy.json", factory);
  CHECK(g.model.num_parameters() == f.model.num_parameters());
  CHECK(g.model.layer(3).attributes() == f.model.layer(3).attributes());
  CHECK(g.loss == "hinge");
}

TEST_CASE("bad model files are errors naming the file and the place", "[io][model_file][errors]") {
  const auto factory = LayerFactory::with_builtins();
  const auto fails = [&](const std::string& text, const std::string& needle) {
    INFO(text);
    CHECK_THROWS_WITH(parse_model_file(text, "m.json", factory),
                      Catch::Contains("m.json") && Catch::Contains(needle));
  };
  fails("{\"input_shape\": [4],\n \"layers\": [\n {\"kind\": \"relu\",}]}", "line 3");
  fails("", "line 1");
  fails("[1, 2]", "JSON object");
  fails(R"({"layers": [{"kind": "relu"}]})", "missing input_shape");
  fails(R"({"input_shape": [0], "layers": [{"kind": "relu"}]})", "input_shape");
  fails(R"({"input_shape": [1000000, 1000000], "layers": [{"kind": "relu"}]})", "input_shape");
  fails(R"({"input_shape": [4], "layers": []})", "layers");
  fails(R"({"input_shape": [4], "layers": [{"kind": "nope"}]})", "layers[0] (nope)");
  fails(R"({"input_shape": [4], "layers": [{"kind": "relu"}, {"kind": "conv2d",
            "out_channels": 2, "kernel_size": 3}]})",
        "layers[1] (conv2d)");
  fails(R"({"input_shape": [4], "layers": [{"kind": "linear"}]})", "out_features");
  fails(R"({"input_shape": [4], "layers": [{"kind": "relu"}], "loss": "l1"})", "unknown loss");
  fails(R"({"input_shape": [4], "layers": [{"kind": "relu"}], "l2": -1})", "l2");
  fails(R"({"input_shape": [4], "layers": [{"kind": "relu"}], "dtype": "int8"})", "m.json");
  fails(R"({"input_shape": [4], "layerz": []})", "unknown key 'layerz'");
  fails(R"({"input_shape": [4], "layers": [{"kind": "linear", "out_features": 1000000000}]})",
        "larger than 2^24");
  fails(R"({"input_shape": [16384, 16384], "layers": [{"kind": "linear", "out_features": 16384}]})",
        "2^28 parameters");
  fails(R"({"input_shape": [4], "layers": [{"kind": "linear", "out_features": 2.5}]})",
        "wrong type");
  fails(R"({"input_shape": [4], "layers": [{"kind": "relu"}], "polyprobe_model": 2})", "version");
}

TEST_CASE("a missing model file is an error naming it", "[io][model_file][errors]") {
  CHECK_THROWS_WITH(read_model_file("/nonexistent/m.json", LayerFactory::with_builtins()),
                    Catch::Contains("/nonexistent/m.json"));
}

}  // namespace polyprobe
