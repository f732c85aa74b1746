// Data: CSV (plain and gzip), IDX, the embedded digits, splits, standardisation, minibatches,
// and malformed files refused with the file and the line or offset named.
#include "io/temp_dir.hpp"

#include <polyprobe/data.hpp>
#include <polyprobe/error.hpp>

#include <catch2/catch.hpp>

#include <zlib.h>

#include <cstdlib>
#include <set>

namespace polyprobe {
namespace {

std::string gzip(const std::string& text) {
  uLongf size = compressBound(static_cast<uLong>(text.size())) + 32;
  std::string out(size, '\0');
  z_stream s{};
  deflateInit2(&s, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  s.avail_in = static_cast<uInt>(text.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  deflate(&s, Z_FINISH);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

std::string idx(uint8_t type, std::vector<uint32_t> dims, const std::string& data) {
  std::string bytes{'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8)
      bytes.push_back(static_cast<char>((d >> shift) & 0xff));
  return bytes + data;
}

std::span<const uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

TEST_CASE("CSV with and without scikit-learn's header", "[io][data][csv]") {
  const Dataset plain = parse_csv("1,2,0\n3,4,1\r\n5,6,2\n\n", "a.csv");
  CHECK(plain.size() == 3);
  CHECK(plain.num_classes == 3);
  CHECK(plain.features(2, 1) == 6.0);
  const Dataset iris = parse_csv("2,2,setosa,versicolor\n1.5,2,0\n3,4e-1,1\n", "iris.csv");
  CHECK(iris.size() == 2);
  CHECK(iris.features(1, 1) == Approx(0.4));
  CHECK(iris.num_classes == 2);
  const Dataset named = parse_csv("x,y,label\n1,2,1\n", "named.csv");
  CHECK(named.labels == std::vector<int64_t>{1});
}

TEST_CASE("a UTF-8 byte-order mark before the first line is not data", "[io][data][csv]") {
  const Dataset marked = parse_csv(
      "\xEF\xBB\xBF"
      "1,2,0\n3,4,1\n",
      "bom.csv");
  CHECK(marked.size() == 2);
  CHECK(marked.features(0, 0) == 1.0);
  const Dataset header = parse_csv(
      "\xEF\xBB\xBF"
      "x,y,label\n1,2,1\n",
      "bom-header.csv");
  CHECK(header.labels == std::vector<int64_t>{1});
}

TEST_CASE("gzip CSV files are read and truncated ones refused", "[io][data][csv]") {
  testing::TempDir dir;
  const std::string text = "1,2,0\n3,4,1\n";
  CHECK(read_csv(dir.write("d.csv.gz", gzip(text))).size() == 2);
  CHECK(read_csv(dir.write("d.csv", text)).size() == 2);
  const std::string gz = gzip(text);
  CHECK_THROWS_WITH(read_csv(dir.write("t.csv.gz", gz.substr(0, gz.size() / 2))),
                    Catch::Contains("t.csv.gz") && Catch::Contains("gzip"));
}

TEST_CASE("malformed CSV is an error naming the file and the line", "[io][data][csv][errors]") {
  const auto fails = [](const std::string& text, const std::string& needle) {
    INFO(text);
    CHECK_THROWS_WITH(parse_csv(text, "bad.csv"),
                      Catch::Contains("bad.csv") && Catch::Contains(needle));
  };
  fails("1,2,0\n3,4\n", "line 2");
  fails("1,2,0\n3,x,1\n", "line 2, column 2");
  fails("1,nan,0\n", "not finite");
  fails("1,inf,0\n", "not finite");
  fails("1,2,0.5\n", "label");
  fails("1,2,-1\n", "label");
  fails("1,2,1e300\n", "label");
  fails("3,2,a,b\n1,2,0\n", "declares 3 samples");
  fails("2,2,a,b\n1,2,0\n1,2,5\n", "out of range");
  fails("", "no data");
  fails("a,b\n", "no data");
  fails("5\n", "line 1");
}

TEST_CASE("IDX arrays and bad headers refused with the offset", "[io][data][idx][errors]") {
  const IdxArray a = parse_idx(as_bytes(idx(0x08, {2, 3}, "\x01\x02\x03\x04\x05\x06")), "a.idx");
  CHECK(a.dims == std::vector<int64_t>{2, 3});
  CHECK(a.values[5] == 6.0);
  const auto fails = [](const std::string& bytes, const std::string& needle) {
    CHECK_THROWS_WITH(parse_idx(as_bytes(bytes), "bad.idx"),
                      Catch::Contains("bad.idx") && Catch::Contains(needle));
  };
  fails("\x01\x00\x08\x01", "offset 0");
  fails(std::string("\x00\x00\x07\x01", 4), "type");
  fails(idx(0x08, {2, 3}, "\x01\x02"), "truncated");
  fails(idx(0x08, {0xffffffff, 0xffffffff, 0xffffffff}, "\x01\x02"), "truncated or corrupt");
  fails(std::string("\x00\x00\x08\x02\x00\x00", 6), "header");
  const std::string nan_float("\x7f\xc0\x00\x00", 4);
  fails(idx(0x0D, {1}, nan_float), "not finite");
}

TEST_CASE("IDX images with labels and mismatched labels refused", "[io][data][idx][errors]") {
  testing::TempDir dir;
  const auto images =
      dir.write("x-images-idx3-ubyte.gz", gzip(idx(0x08, {2, 2, 2}, std::string(8, '\x07'))));
  const auto labels = dir.write("x-labels-idx1-ubyte.gz", gzip(idx(0x08, {2}, "\x01\x03")));
  const Dataset d = read_idx(images, labels);
  CHECK(d.sample_shape == Shape{{1, 2, 2}});
  CHECK(d.labels == std::vector<int64_t>{1, 3});
  CHECK(load_data(images.string()).train.size() == 2);  // labels found beside the images
  const auto three = dir.write("three.idx", idx(0x08, {3}, "\x01\x02\x03"));
  CHECK_THROWS_WITH(read_idx(images, three), Catch::Contains("3 labels"));
}

TEST_CASE("the embedded digits data set", "[io][data]") {
  const Dataset digits = embedded_digits();
  CHECK(digits.size() == 1797);
  CHECK(digits.features.cols() == 64);
  CHECK(digits.num_classes == 10);
  CHECK(digits.sample_shape == Shape{{1, 8, 8}});
  CHECK(digits.features.maxCoeff() == 16.0);
  // Identical to the file it was generated from.
  const Dataset file = read_csv(std::filesystem::path(POLYPROBE_DATA_DIR) / "digits.csv.gz");
  CHECK(file.features == digits.features);
  CHECK(file.labels == digits.labels);
}

TEST_CASE("Fashion-MNIST from Debian's package when installed", "[io][data][fashion]") {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz") &&
      std::getenv("POLYPROBE_FASHION_MNIST_DIR") == nullptr) {
    WARN("dataset-fashion-mnist is not installed; skipped");
    return;
  }
  // The 10,000-image test split keeps this quick; load_data reads the train split the same way.
  const char* env = std::getenv("POLYPROBE_FASHION_MNIST_DIR");
  const std::filesystem::path dir = env != nullptr ? env : "/usr/share/datasets/fashion-mnist";
  const Dataset test =
      read_idx(dir / "t10k-images-idx3-ubyte.gz", dir / "t10k-labels-idx1-ubyte.gz");
  CHECK(test.size() == 10000);
  CHECK(test.sample_shape == Shape{{1, 28, 28}});
  CHECK(test.num_classes == 10);
  CHECK(test.features.maxCoeff() == 255.0);
}

TEST_CASE("unknown data names say what is known", "[io][data][errors]") {
  CHECK_THROWS_WITH(load_data("mnist-please"),
                    Catch::Contains("digits") && Catch::Contains("fashion-mnist"));
  CHECK_THROWS_WITH(load_data("/nonexistent.csv"), Catch::Contains("/nonexistent.csv"));
}

TEST_CASE("splits are disjoint and seeded and standardised from train only", "[io][data]") {
  SplitOptions options;
  options.seed = 5;
  const PreparedData a = prepare_data("digits", options);
  const PreparedData b = prepare_data("digits", options);
  const DataSplits& s = a.splits;
  CHECK(s.train.size() + s.validation.size() + s.test.size() == 1797);
  CHECK(s.test.size() == 270);
  CHECK(s.train.features == b.splits.train.features);
  // Train columns have mean 0 and std 1 (or are constant 0); test columns only roughly.
  const Vector<double> mean = s.train.features.colwise().mean();
  CHECK(mean.cwiseAbs().maxCoeff() < 1e-9);
  CHECK(a.standardizer.scale.minCoeff() > 0);
  options.seed = 6;
  CHECK(prepare_data("digits", options).splits.train.features != s.train.features);
  const Standardizer back = Standardizer::from_text(a.standardizer.to_text(), "meta");
  CHECK(back.mean.isApprox(a.standardizer.mean));
  CHECK_THROWS_WITH(Standardizer::from_text("{\"mean\": [1], \"scale\": [0]}", "w.safetensors"),
                    Catch::Contains("w.safetensors"));
}

TEST_CASE("minibatch streams cover each epoch once and resume exactly", "[io][data]") {
  Dataset d = parse_csv("0,0\n1,1\n2,0\n3,1\n4,0\n5,1\n6,0\n", "seven.csv");
  MinibatchStream stream(d, 3, 9);
  CHECK(stream.batches_per_epoch() == 3);
  std::multiset<double> seen;
  for (int i = 0; i < 3; ++i) {
    const Batch b = stream.next();
    for (Eigen::Index r = 0; r < b.size(); ++r) seen.insert(b.inputs(r, 0));
  }
  CHECK(seen == std::multiset<double>{0, 1, 2, 3, 4, 5, 6});
  const Batch next = stream.next();  // epoch 1, position 3 after this
  MinibatchStream resumed(d, 3, 9);
  resumed.seek(stream.epoch(), stream.position());
  MinibatchStream fresh(d, 3, 9);
  for (int i = 0; i < 4; ++i) fresh.next();
  CHECK(resumed.next().inputs == fresh.next().inputs);
  CHECK(next.size() == 3);
}

}  // namespace polyprobe
