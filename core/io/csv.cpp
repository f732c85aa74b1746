// CSV data sets: numeric features then an integer class label per line.
#include <polyprobe/data.hpp>
#include <polyprobe/error.hpp>

#include "io/file_util.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>

namespace polyprobe {
namespace {

constexpr uint64_t kMaxCsvBytes = uint64_t{4} << 30;
constexpr int64_t kMaxClasses = 1 << 20;

// Splits one line at commas (no quoting: data sets here are purely numeric).
std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = line.find(',', start);
    std::string_view field =
        line.substr(start, comma == std::string_view::npos ? line.npos : comma - start);
    while (!field.empty() && (field.front() == ' ' || field.front() == '\t'))
      field.remove_prefix(1);
    while (!field.empty() && (field.back() == ' ' || field.back() == '\t')) field.remove_suffix(1);
    fields.push_back(field);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return fields;
}

// The number in `field`, or nullopt when the field is not entirely a number.
std::optional<double> parse_number(std::string_view field) {
  if (!field.empty() && field.front() == '+') field.remove_prefix(1);
  double value = 0.0;
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (ec != std::errc() || end != field.data() + field.size() || field.empty()) return std::nullopt;
  return value;
}

}  // namespace

Dataset parse_csv(std::string_view text, const std::string& source) {
  Dataset data;
  data.name = source;
  std::vector<double> values;
  int64_t columns = -1, declared_samples = -1, declared_classes = -1, line_number = 0;
  // A UTF-8 byte-order mark (spreadsheets write one) is not part of the first line: left in,
  // it makes a numeric first row look like a header.
  constexpr std::string_view byte_order_mark = "\xEF\xBB\xBF";
  std::size_t start = text.starts_with(byte_order_mark) ? byte_order_mark.size() : 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    const std::string where = "'" + source + "', line " + std::to_string(line_number);
    const std::vector<std::string_view> fields = split_fields(line);
    std::vector<double> row;
    bool numeric = true;
    for (std::string_view f : fields) {
      const auto v = parse_number(f);
      if (!v) {
        numeric = false;
        break;
      }
      row.push_back(*v);
    }
    if (!numeric) {
      if (columns != -1 || declared_samples != -1) {
        std::size_t column = 0;
        while (parse_number(fields[column])) ++column;
        throw Error(where + ", column " + std::to_string(column + 1) + ": '" +
                    std::string(fields[column].substr(0, 40)) + "' is not a number");
      }
      // A header. scikit-learn's form: n_samples, n_features, then the class names.
      const auto samples = parse_number(fields[0]);
      const auto features = fields.size() > 1 ? parse_number(fields[1]) : std::nullopt;
      if (samples && features && *samples >= 0 && *features >= 1 && *samples < 1e12 &&
          *features < 1e9) {
        declared_samples = static_cast<int64_t>(*samples);
        columns = static_cast<int64_t>(*features) + 1;
        declared_classes = static_cast<int64_t>(fields.size()) - 2;
      } else {
        declared_samples = -2;  // a plain header seen
      }
      continue;
    }
    if (columns == -1) columns = static_cast<int64_t>(row.size());
    if (static_cast<int64_t>(row.size()) != columns)
      throw Error(where + ": " + std::to_string(row.size()) + " columns, but " +
                  std::to_string(columns) + " expected (features then the label); " +
                  "is the file truncated or ragged?");
    if (columns < 2) throw Error(where + ": a row needs at least one feature and the label");
    for (std::size_t c = 0; c < row.size(); ++c)
      if (!std::isfinite(row[c]))
        throw Error(where + ", column " + std::to_string(c + 1) + ": value is not finite");
    const double label = row.back();
    if (label != std::floor(label) || label < 0 || label >= static_cast<double>(kMaxClasses))
      throw Error(where + ": the label (last column) must be an integer in [0, " +
                  std::to_string(kMaxClasses) + "), got " + std::to_string(label));
    if (declared_classes > 0 && label >= static_cast<double>(declared_classes))
      throw Error(where + ": label " + std::to_string(static_cast<int64_t>(label)) +
                  " is out of range: the header names " + std::to_string(declared_classes) +
                  " classes");
    data.labels.push_back(static_cast<int64_t>(label));
    values.insert(values.end(), row.begin(), row.end() - 1);
  }
  if (data.labels.empty()) throw Error("'" + source + "' holds no data rows");
  const auto n = static_cast<int64_t>(data.labels.size());
  if (declared_samples >= 0 && declared_samples != n)
    throw Error("'" + source + "': the header declares " + std::to_string(declared_samples) +
                " samples but the file has " + std::to_string(n) + "; is it truncated?");
  data.sample_shape = Shape{{columns - 1}};
  data.features = Eigen::Map<const Matrix<double>>(values.data(), n, columns - 1);
  int64_t max_label = 0;
  for (int64_t l : data.labels) max_label = std::max(max_label, l);
  data.num_classes = std::max(max_label + 1, declared_classes);
  return data;
}

Dataset read_csv(const std::filesystem::path& path) {
  const std::vector<uint8_t> bytes = io::read_maybe_gzip(path, kMaxCsvBytes);
  Dataset data = parse_csv(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path.string());
  data.name = path.filename().string();
  return data;
}

}  // namespace polyprobe
