// Safetensors: round trips, PyTorch's files, and hostile files refused with the tensor named.
#include "io/temp_dir.hpp"

#include <polyprobe/atomic_file.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/model_file.hpp>
#include <polyprobe/safetensors.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>

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

TEST_CASE("a training checkpoint given as weights is named as such", "[io][safetensors][errors]") {
  const std::string checkpoint = "polyprobe-checkpoint 1\n" + std::string(64, '\0');
  CHECK_THROWS_WITH(parse_safetensors(as_bytes(checkpoint), "run.ckpt"),
                    Catch::Contains("'run.ckpt' is a polyprobe training checkpoint") &&
                        Catch::Contains("--resume"));
}

TEST_CASE("outputs are written only as regular files", "[io][outputs]") {
  TempDir dir;
  const Model model = small_model();
  // A FIFO, and a link to a character device: refused, and left as they were.
  const std::filesystem::path fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(save_weights(model, fifo), Catch::Contains("it is a FIFO (named pipe)"));
  CHECK(std::filesystem::is_fifo(std::filesystem::symlink_status(fifo)));
  const std::filesystem::path null_link = dir / "null-link";
  std::filesystem::create_symlink("/dev/null", null_link);
  CHECK_THROWS_WITH(save_weights(model, null_link), Catch::Contains("it is a character device"));
  CHECK(std::filesystem::is_symlink(std::filesystem::symlink_status(null_link)));
  CHECK(std::filesystem::is_character_file("/dev/null"));
  CHECK_THROWS_WITH(io::check_output_file("", "--save file"),
                    Catch::Contains("the --save file name is empty"));
  CHECK_THROWS_WITH(save_weights(model, dir.path()), Catch::Contains("it is a folder"));

  // A read-only file is refused; a writable one keeps its permissions; a link to a regular
  // file stays a link and the file it names is replaced.
  const std::filesystem::path kept = dir / "kept.safetensors";
  std::ofstream(kept) << "x";
  std::filesystem::permissions(kept, std::filesystem::perms::owner_read);
  CHECK_THROWS_WITH(save_weights(model, kept), Catch::Contains("it is read-only"));
  CHECK(std::filesystem::file_size(kept) == 1);
  const std::filesystem::path shared = dir / "shared.safetensors";
  std::ofstream(shared) << "x";
  const auto mode = std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                    std::filesystem::perms::group_read | std::filesystem::perms::group_write;
  std::filesystem::permissions(shared, mode);
  save_weights(model, shared);
  CHECK(std::filesystem::status(shared).permissions() == mode);
  CHECK(std::filesystem::file_size(shared) > 1);
  const std::filesystem::path link = dir / "link.safetensors";
  std::filesystem::create_symlink(shared, link);
  save_weights(model, link);
  CHECK(std::filesystem::is_symlink(std::filesystem::symlink_status(link)));
}

TEST_CASE("an output is claimed by one writer at a time", "[io][outputs]") {
  TempDir dir;
  const std::filesystem::path path = dir / "run.safetensors";
  {
    const io::OutputLock first(path, "--save file");
    CHECK(std::filesystem::exists(dir / ".run.safetensors.lock"));
    // A second claim (flock() locks per open file, so this process stands for another one).
    CHECK_THROWS_WITH(
        io::OutputLock(path, "--save file"),
        Catch::Contains("another process is writing the --save file '" + path.string() + "'"));
  }
  CHECK_FALSE(std::filesystem::exists(dir / ".run.safetensors.lock"));
  const io::OutputLock again(path, "--save file");
}

}  // namespace polyprobe
