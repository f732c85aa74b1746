// Safetensors: round trips, PyTorch's files, and hostile files refused with the tensor named.
#include "io/temp_dir.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/model_file.hpp>
#include <polyprobe/safetensors.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstring>

namespace polyprobe {
namespace {

using testing::TempDir;

std::string file_bytes(const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  return bytes + header + data;
}

std::span<const uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

Model small_model() {
  const auto factory = LayerFactory::with_builtins();
  ModelFile f = parse_model_file(
      R"({"input_shape": [3], "layers": [{"kind": "linear", "out_features": 2}, {"kind": "relu"},
          {"kind": "linear", "out_features": 2, "bias": false}]})",
      "test", factory);
  f.model.initialize(1);
  return f.model;
}

}  // namespace

TEST_CASE("weights round-trip through safetensors with PyTorch names", "[io][safetensors]") {
  TempDir dir;
  const Model model = small_model();
  save_weights(model, dir / "w.safetensors");
  const TensorFile file = read_safetensors(dir / "w.safetensors");
  REQUIRE(file.tensors.size() == 3);
  CHECK(file.tensors[0].name == "0.weight");
  CHECK(file.tensors[1].name == "0.bias");
  CHECK(file.tensors[2].name == "2.weight");
  CHECK(file.tensors[0].shape == std::vector<int64_t>{2, 3});
  CHECK(file.tensors[0].dtype == "F32");
  Model copy = small_model();
  std::fill(copy.parameters().begin(), copy.parameters().end(), 0.0);
  load_weights(copy, dir / "w.safetensors");
  for (std::size_t i = 0; i < copy.parameters().size(); ++i)
    CHECK(copy.parameters()[i] == Approx(model.parameters()[i]).epsilon(1e-7));
  CHECK(dir.files() == std::vector<std::string>{"w.safetensors"});  // no temporary left
}

TEST_CASE("PyTorch-written files load (the fixtures)", "[io][safetensors]") {
  const TensorFile file =
      read_safetensors(std::filesystem::path(POLYPROBE_FIXTURE_DIR) / "model_mlp.safetensors");
  REQUIRE(file.find("0.weight") != nullptr);
  CHECK(file.find("0.weight")->shape == std::vector<int64_t>{32, 64});
  CHECK(file.find("2.bias")->shape == std::vector<int64_t>{10});
}

TEST_CASE("F16 and BF16 tensors are read", "[io][safetensors]") {
  const std::string data("\x00\x3c\x00\xc0\x80\x3f\x00\x40", 8);  // f16 1, -2; bf16 1, 2
  const std::string header =
      R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]}})";
  const TensorFile f = parse_safetensors(as_bytes(file_bytes(header, data)), "mem");
  CHECK(f.find("a")->values == std::vector<double>{1.0, -2.0});
  CHECK(f.find("b")->values == std::vector<double>{1.0, 2.0});
}

TEST_CASE("hostile safetensors files are errors naming the file and the place",
          "[io][safetensors][errors]") {
  const std::string four_floats(16, '\0');
  const auto fails = [](const std::string& bytes, const std::string& needle) {
    CHECK_THROWS_WITH(parse_safetensors(as_bytes(bytes), "bad.safetensors"),
                      Catch::Contains("bad.safetensors") && Catch::Contains(needle));
  };
  fails("abc", "fewer than the 8-byte");
  fails(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "header length");
  fails(file_bytes("{not json", ""), "malformed");
  fails(file_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,160]}})", four_floats),
        "tensor 'w'");
  fails(file_bytes(R"({"w":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})",
                   four_floats + four_floats),
        "expected 20");
  fails(file_bytes(R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", four_floats),
        "unsupported dtype");
  fails(file_bytes(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}})",
                   four_floats),
        "more elements");
  fails(file_bytes(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,16]}})", four_floats),
        "shape");
  fails(file_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},
                      "b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                   four_floats),
        "overlap");
  fails(file_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", four_floats),
        "data_offsets");
  fails(file_bytes(R"({"w":{"dtype":"F32","shape":[4]}})", four_floats), "needs dtype");
}

TEST_CASE("weights that do not fit the model are refused and the model is unchanged",
          "[io][safetensors][errors]") {
  TempDir dir;
  Model model = small_model();
  const std::vector<double> before(model.parameters().begin(), model.parameters().end());
  TensorFile file = model_tensors(model);
  SECTION("wrong shape") {
    file.tensors[0].shape = {3, 2};
    CHECK_THROWS_WITH(assign_model_tensors(model, file, "x.safetensors"),
                      Catch::Contains("tensor '0.weight'") && Catch::Contains("[2, 3]"));
  }
  SECTION("missing tensor") {
    file.tensors.erase(file.tensors.begin() + 1);
    CHECK_THROWS_WITH(assign_model_tensors(model, file, "x.safetensors"),
                      Catch::Contains("0.bias"));
  }
  SECTION("extra tensor") {
    file.tensors.push_back({"9.weight", {1}, "F32", {1.0}});
    CHECK_THROWS_WITH(assign_model_tensors(model, file, "x.safetensors"),
                      Catch::Contains("9.weight"));
  }
  SECTION("NaN weight") {
    file.tensors[2].values[1] = std::nan("");
    CHECK_THROWS_WITH(assign_model_tensors(model, file, "x.safetensors"),
                      Catch::Contains("'2.weight': element 1 is not finite"));
  }
  CHECK(std::equal(before.begin(), before.end(), model.parameters().begin()));
}

TEST_CASE("a failed write leaves no partial file", "[io][safetensors][errors]") {
  TempDir dir;
  const Model model = small_model();
  CHECK_THROWS_AS(save_weights(model, dir / "missing-folder" / "w.safetensors"), Error);
  CHECK(dir.files().empty());
}

}  // namespace polyprobe
