// The known data sets, splits, standardisation and minibatch streams.
#include <polyprobe/data.hpp>
#include <polyprobe/error.hpp>

#include "io/embedded_data.hpp"
#include "io/file_util.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>

namespace polyprobe {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

fs::path fashion_mnist_dir() {
  const char* env = std::getenv("POLYPROBE_FASHION_MNIST_DIR");
  return env != nullptr && *env != '\0' ? fs::path(env) : fs::path(kFashionMnistDir);
}

// train-images-idx3-ubyte(.gz) -> train-labels-idx1-ubyte(.gz), in the same folder.
fs::path labels_beside(const fs::path& images) {
  std::string name = images.filename().string();
  const std::size_t at = name.find("images-idx3");
  if (at == std::string::npos)
    throw Error("cannot find the labels of IDX images '" + images.string() +
                "': name them *-images-idx3-ubyte[.gz] with *-labels-idx1-ubyte[.gz] beside them");
  name.replace(at, 11, "labels-idx1");
  return images.parent_path() / name;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

// Rows [begin, end) of `order` as a subset of `data`, named `data.name + "/" + part`.
Dataset take(const Dataset& data, const std::vector<int64_t>& order, std::size_t begin,
             std::size_t end, const char* part) {
  Dataset out = data.subset(std::span<const int64_t>(order).subspan(begin, end - begin));
  out.name = data.name + "/" + part;
  return out;
}

}  // namespace

Dataset Dataset::subset(std::span<const int64_t> rows) const {
  Dataset out;
  out.name = name;
  out.sample_shape = sample_shape;
  out.num_classes = num_classes;
  out.features.resize(static_cast<Eigen::Index>(rows.size()), features.cols());
  out.labels.reserve(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    out.features.row(static_cast<Eigen::Index>(i)) = features.row(rows[i]);
    out.labels.push_back(labels[static_cast<std::size_t>(rows[i])]);
  }
  return out;
}

Dataset embedded_digits() {
  const std::span<const uint8_t> gz = io::embedded_digits_csv_gz();
  const std::vector<uint8_t> text =
      io::gunzip_if_needed(std::vector<uint8_t>(gz.begin(), gz.end()), "embedded digits", 1 << 24);
  Dataset data = parse_csv(
      std::string_view(reinterpret_cast<const char*>(text.data()), text.size()), "embedded digits");
  data.name = "digits";
  data.sample_shape = Shape{{1, 8, 8}};
  return data;
}

std::vector<std::string> known_datasets() { return {"digits", "fashion-mnist"}; }

LoadedData load_data(const std::string& name_or_path) {
  if (name_or_path == "digits") return {embedded_digits(), std::nullopt};
  if (name_or_path == "fashion-mnist") {
    const fs::path dir = fashion_mnist_dir();
    if (!fs::exists(dir / "train-images-idx3-ubyte.gz"))
      throw Error("Fashion-MNIST is not installed in " + dir.string() +
                  ": install Debian's package dataset-fashion-mnist (apt-get install "
                  "dataset-fashion-mnist) or set POLYPROBE_FASHION_MNIST_DIR");
    LoadedData data{
        read_idx(dir / "train-images-idx3-ubyte.gz", dir / "train-labels-idx1-ubyte.gz"),
        read_idx(dir / "t10k-images-idx3-ubyte.gz", dir / "t10k-labels-idx1-ubyte.gz")};
    data.train.name = "fashion-mnist";
    data.test->name = "fashion-mnist/test";
    data.test->num_classes = data.train.num_classes =
        std::max(data.train.num_classes, data.test->num_classes);
    return data;
  }
  const fs::path path(name_or_path);
  const std::string file = path.filename().string();
  if (ends_with(file, ".csv") || ends_with(file, ".csv.gz")) return {read_csv(path), std::nullopt};
  if (file.find("idx3") != std::string::npos)
    return {read_idx(path, labels_beside(path)), std::nullopt};
  std::string known;
  for (const auto& k : known_datasets()) known += (known.empty() ? "" : ", ") + k;
  throw Error("unknown data '" + name_or_path + "': use a known name (" + known +
              "), a .csv or .csv.gz file, or an IDX *-images-idx3-ubyte[.gz] file");
}

DataSplits split_data(LoadedData data, const SplitOptions& options) {
  const auto fraction_ok = [](double f) { return f >= 0.0 && f < 1.0; };
  if (!fraction_ok(options.validation_fraction) || !fraction_ok(options.test_fraction) ||
      options.validation_fraction + options.test_fraction >= 1.0)
    throw Error("validation and test fractions must be in [0, 1) and sum to less than 1");
  const Dataset& all = data.train;
  const std::vector<int64_t> order = permutation(all.size(), options.seed);
  const auto n = static_cast<std::size_t>(all.size());
  const auto count = [&](double fraction, std::size_t of) {
    return static_cast<std::size_t>(std::llround(fraction * static_cast<double>(of)));
  };
  DataSplits splits;
  std::size_t train_end = n;
  if (data.test) {
    splits.test = std::move(*data.test);
  } else {
    const std::size_t test = count(options.test_fraction, n);
    splits.test = take(all, order, n - test, n, "test");
    train_end = n - test;
  }
  const std::size_t validation = count(options.validation_fraction, train_end);
  splits.validation = take(all, order, train_end - validation, train_end, "validation");
  splits.train = take(all, order, 0, train_end - validation, "train");
  if (splits.train.size() == 0)
    throw Error("data '" + all.name + "' has too few samples (" + std::to_string(all.size()) +
                ") to split into train, validation and test");
  return splits;
}

Standardizer Standardizer::fit(const Dataset& train) {
  if (train.size() == 0) throw Error("cannot standardise with an empty training split");
  Standardizer s;
  s.mean = train.features.colwise().mean().transpose();
  s.scale.resize(s.mean.size());
  for (Eigen::Index c = 0; c < s.mean.size(); ++c) {
    const double var = (train.features.col(c).array() - s.mean(c)).square().mean();
    s.scale(c) = var > 1e-24 ? std::sqrt(var) : 1.0;
  }
  return s;
}

void Standardizer::apply(Dataset& data) const {
  if (data.features.cols() != mean.size())
    throw Error("data '" + data.name + "' has " + std::to_string(data.features.cols()) +
                " features, the standardiser was fitted on " + std::to_string(mean.size()));
  data.features =
      ((data.features.rowwise() - mean.transpose()).array().rowwise() / scale.transpose().array())
          .matrix();
}

std::string Standardizer::to_text() const {
  return nlohmann::json{{"mean", std::vector<double>(mean.begin(), mean.end())},
                        {"scale", std::vector<double>(scale.begin(), scale.end())}}
      .dump();
}

Standardizer Standardizer::from_text(const std::string& text, const std::string& source) {
  Standardizer s;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    const auto mean = j.at("mean").get<std::vector<double>>();
    const auto scale = j.at("scale").get<std::vector<double>>();
    if (mean.size() != scale.size()) throw Error("mean and scale differ in length");
    for (std::size_t i = 0; i < mean.size(); ++i)
      if (!std::isfinite(mean[i]) || !(scale[i] > 0) || !std::isfinite(scale[i]))
        throw Error("entry " + std::to_string(i) + " is not finite or its scale is not positive");
    s.mean = Eigen::Map<const Vector<double>>(mean.data(), static_cast<Eigen::Index>(mean.size()));
    s.scale =
        Eigen::Map<const Vector<double>>(scale.data(), static_cast<Eigen::Index>(scale.size()));
  } catch (const std::exception& e) {
    throw Error("'" + source + "': invalid standardisation statistics: " + e.what());
  }
  return s;
}

PreparedData prepare_data(const std::string& name_or_path, const SplitOptions& options,
                          const Standardizer* fixed) {
  PreparedData prepared{split_data(load_data(name_or_path), options), {}};
  prepared.standardizer = fixed != nullptr ? *fixed : Standardizer::fit(prepared.splits.train);
  for (Dataset* split :
       {&prepared.splits.train, &prepared.splits.validation, &prepared.splits.test})
    if (split->size() > 0) prepared.standardizer.apply(*split);
  return prepared;
}

Batch to_batch(const Dataset& data) {
  Batch batch;
  batch.inputs = data.features;
  batch.targets.labels = data.labels;
  return batch;
}

MinibatchStream::MinibatchStream(const Dataset& data, int64_t batch_size, uint64_t seed)
    : data_(&data), batch_size_(batch_size), seed_(seed) {
  if (batch_size <= 0) throw Error("the batch size must be positive");
  if (data.size() == 0)
    throw Error("cannot draw minibatches from the empty data '" + data.name + "'");
  shuffle();
}

int64_t MinibatchStream::batches_per_epoch() const {
  return (data_->size() + batch_size_ - 1) / batch_size_;
}

void MinibatchStream::shuffle() {
  // A fresh, well-mixed seed per epoch: (seed, epoch) -> permutation.
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32),
                    static_cast<uint32_t>(epoch_), static_cast<uint32_t>(epoch_ >> 32)};
  std::mt19937_64 rng(seq);
  order_ = permutation(data_->size(), rng());
}

void MinibatchStream::seek(int64_t epoch, int64_t position) {
  if (epoch < 0 || position < 0 || position > data_->size())
    throw Error("cannot resume minibatches at epoch " + std::to_string(epoch) + ", position " +
                std::to_string(position) + " of " + std::to_string(data_->size()));
  epoch_ = epoch;
  position_ = position;
  shuffle();
}

Batch MinibatchStream::next() {
  if (position_ >= data_->size()) {
    ++epoch_;
    position_ = 0;
    shuffle();
  }
  const int64_t take_rows = std::min(batch_size_, data_->size() - position_);
  // Gathered straight into the batch: a Dataset in between would copy every row twice.
  Batch batch;
  batch.inputs.resize(take_rows, data_->features.cols());
  batch.targets.labels.resize(static_cast<std::size_t>(take_rows));
  for (int64_t i = 0; i < take_rows; ++i) {
    const int64_t row = order_[static_cast<std::size_t>(position_ + i)];
    batch.inputs.row(i) = data_->features.row(row);
    batch.targets.labels[static_cast<std::size_t>(i)] =
        data_->labels[static_cast<std::size_t>(row)];
  }
  position_ += take_rows;
  return batch;
}

}  // namespace polyprobe
