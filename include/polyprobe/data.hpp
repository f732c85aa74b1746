// Classification data: reading (CSV, gzip CSV, IDX), the known data sets, splitting,
// standardisation and minibatches.
//
// A Dataset is a [n, features] float64 matrix with one integer class label per row. Readers
// trust nothing: a truncated or malformed file, a non-numeric or non-finite value, a ragged
// row, a negative or absurd label, an IDX header whose sizes disagree with the data, is a
// polyprobe::Error naming the file and the line (CSV) or byte offset (IDX). Known names:
// "digits" (UCI optical digits, 1797 samples of 8x8, embedded in the library at build time,
// so it always works) and "fashion-mnist" (Debian's dataset-fashion-mnist package, found under
// /usr/share/datasets/fashion-mnist or $POLYPROBE_FASHION_MNIST_DIR). Everything random
// (splits, shuffles) is a function of an explicit seed, so a run is reproducible and resumable.
#pragma once

#include <polyprobe/batch.hpp>
#include <polyprobe/tensor.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace polyprobe {

struct Dataset {
  std::string name;
  Shape sample_shape;           // e.g. {64}, or {1, 28, 28} for IDX images
  Matrix<double> features;      // [size(), sample_shape.numel()]
  std::vector<int64_t> labels;  // [size()], each in [0, num_classes)
  int64_t num_classes = 0;
  int64_t size() const { return features.rows(); }
  // Rows `rows` of this data set, in that order.
  Dataset subset(std::span<const int64_t> rows) const;
};

// CSV: one sample per line, numeric features then an integer label (the last column); a
// first line with any non-numeric field is a header. scikit-learn's header convention
// ("n_samples,n_features,class names...") is checked against the data that follows.
Dataset parse_csv(std::string_view text, const std::string& source);
// A .csv file, gzip-compressed or not (detected from its first bytes).
Dataset read_csv(const std::filesystem::path& path);

// An IDX array (the MNIST format): dims and values as float64.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<double> values;
};
IdxArray parse_idx(std::span<const uint8_t> bytes, const std::string& source);
// IDX images [n, ...] and labels [n] (each gzip-compressed or not) as a data set.
Dataset read_idx(const std::filesystem::path& images, const std::filesystem::path& labels);

// The data the library carries: UCI optical digits, 8x8 grey levels 0..16, 10 classes.
Dataset embedded_digits();

// A data set and, where it comes with one, its own test split.
struct LoadedData {
  Dataset train;
  std::optional<Dataset> test;
};
// "digits", "fashion-mnist", a .csv/.csv.gz file, or an IDX images file whose labels file
// is found beside it (train-images-idx3-ubyte.gz -> train-labels-idx1-ubyte.gz).
LoadedData load_data(const std::string& name_or_path);
// The known names, for help texts.
std::vector<std::string> known_datasets();

struct SplitOptions {
  double validation_fraction = 0.15;  // of the training data
  double test_fraction = 0.15;        // of all data, when it has no test split of its own
  uint64_t seed = 0;
};
struct DataSplits {
  Dataset train, validation, test;
};
// Shuffles (seeded) and splits; a data set's own test split is kept as it is.
DataSplits split_data(LoadedData data, const SplitOptions& options);

// Per-feature standardisation, (x - mean) / std, with statistics from the training split
// only (a constant feature gets std 1, so it maps to 0).
struct Standardizer {
  Vector<double> mean, scale;
  static Standardizer fit(const Dataset& train);
  void apply(Dataset& data) const;
  // As text ({"mean": [...], "scale": [...]}), e.g. for a weight file's metadata, and back;
  // from_text throws an Error naming `source` when the text is not a valid standardiser.
  std::string to_text() const;
  static Standardizer from_text(const std::string& text, const std::string& source);
};

// Loads `name_or_path`, splits it, and standardises every split with statistics from the
// training split (or with `fixed`, e.g. the ones saved with trained weights).
struct PreparedData {
  DataSplits splits;
  Standardizer standardizer;
};
PreparedData prepare_data(const std::string& name_or_path, const SplitOptions& options,
                          const Standardizer* fixed = nullptr);

// The whole data set as one batch.
Batch to_batch(const Dataset& data);

// Minibatches over a data set, reshuffled every epoch by a permutation that depends only on
// (seed, epoch), so a stream is resumed exactly from (epoch, position). The last batch of an
// epoch may be smaller.
class MinibatchStream {
 public:
  MinibatchStream(const Dataset& data, int64_t batch_size, uint64_t seed);
  // The next batch; moves on to the next epoch after the last one.
  Batch next();
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }  // rows of this epoch already served
  int64_t batches_per_epoch() const;
  // Continues from a saved (epoch, position).
  void seek(int64_t epoch, int64_t position);

 private:
  void shuffle();
  const Dataset* data_;
  int64_t batch_size_;
  uint64_t seed_;
  int64_t epoch_ = 0, position_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace polyprobe
