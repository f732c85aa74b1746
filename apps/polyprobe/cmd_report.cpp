// `polyprobe report`: pictures of one or more training runs from their --metrics files.
//
// Reads the JSON lines `polyprobe train --metrics` writes (core/train/train.cpp: one record per
// step with step, epoch, loss, accuracy, candidates, seconds and the candidates per evaluation
// path; one per validation with "split": "validation") and writes one self-contained HTML page
// of inline SVG charts: no script, no style sheet or font from the network. Runs are overlaid,
// one colour each, named in a legend. A file that cannot be read, a line that is not a metrics
// record, or a file without records is an error naming the file and the line.
#include "cli.hpp"

#include <polyprobe/atomic_file.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>

namespace polyprobe::app {
namespace {

namespace fs = std::filesystem;

struct StepRecord {
  double step = 0, seconds = 0, candidates = 0;
  std::optional<double> loss, accuracy;
  std::map<std::string, double> paths;  // candidates per evaluation path in this step
};

struct Run {
  std::string name;  // the legend's label
  std::string path;
  std::vector<StepRecord> steps, validations;
};

// ---- reading ------------------------------------------------------------------------------

std::optional<double> number_field(const nlohmann::json& record, const char* key,
                                   const std::string& where, bool required) {
  const auto it = record.find(key);
  if (it == record.end() || it->is_null()) {
    if (required) throw Error(where + ": the record has no \"" + key + "\" number");
    return std::nullopt;
  }
  if (!it->is_number())
    throw Error(where + ": \"" + key + "\" is " + it->dump() + ", not a number");
  return it->get<double>();
}

Run read_run(const std::string& path) {
  std::error_code ec;
  // A FIFO would block the open until a writer came.
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec))
    throw Error("the metrics file '" + path + "' is not a regular file (a folder, device or FIFO)");
  std::ifstream file(path);
  if (!file) throw Error("cannot read the metrics file '" + path + "' (does it exist?)");
  Run run;
  run.path = path;
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "metrics file '" + path + "', line " + std::to_string(number);
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(where + ": not JSON (syntax error at column " + std::to_string(e.byte) +
                  "); is it a `polyprobe train --metrics` file?");
    } catch (const nlohmann::json::out_of_range&) {
      throw Error(where + ": a number is too large for a double (beyond 1.8e308)");
    } catch (const nlohmann::json::exception& e) {
      throw Error(where + ": not a metrics record (" + e.what() + ")");
    }
    if (!record.is_object())
      throw Error(where + ": not a metrics record (a JSON object with step and seconds)");
    StepRecord r;
    r.step = *number_field(record, "step", where, true);
    r.seconds = *number_field(record, "seconds", where, true);
    r.candidates = number_field(record, "candidates", where, false).value_or(0);
    r.loss = number_field(record, "loss", where, false);
    r.accuracy = number_field(record, "accuracy", where, false);
    if (const auto paths = record.find("paths"); paths != record.end() && paths->is_object())
      for (const auto& [name, count] : paths->items())
        if (count.is_number()) r.paths[name] = count.get<double>();
    const std::string split = record.value("split", std::string());
    if (split == "test") continue;  // train's final record: the restored state's test result
    (split == "validation" ? run.validations : run.steps).push_back(std::move(r));
  }
  if (file.bad()) throw Error("cannot read the metrics file '" + path + "'");
  if (run.steps.empty() && run.validations.empty())
    throw Error("metrics file '" + path + "' is empty: no records to draw");
  return run;
}

// Legend labels: the file names, or the paths where two runs share a name.
void name_runs(std::vector<Run>& runs) {
  for (Run& run : runs) run.name = fs::path(run.path).filename().string();
  for (Run& run : runs)
    if (std::count_if(runs.begin(), runs.end(), [&](const Run& r) { return r.name == run.name; }) >
        1)
      run.name = run.path;
}

// ---- drawing ------------------------------------------------------------------------------

const std::vector<std::string> kColours = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                           "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string fmt(double value, int precision = 4) {
  std::ostringstream s;
  s << std::setprecision(precision) << value;
  return s.str();
}

struct Series {
  std::string label, colour;
  std::vector<std::pair<double, double>> points;
  double opacity = 1, width = 1.6;
  bool dots = false;
  // (optional) a filled band between `points` and these (same x), for stacked shares.
  std::vector<std::pair<double, double>> band_floor = {};
};

// Tick positions at 1, 2 or 5 times a power of ten, about `count` of them over [lo, hi].
std::vector<double> ticks(double lo, double hi, int count) {
  const double raw = (hi - lo) / std::max(count, 1);
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  double step = magnitude;
  for (const double m : {1.0, 2.0, 5.0, 10.0})
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return values[static_cast<std::size_t>(q * static_cast<double>(values.size() - 1))];
}

// One chart: a frame with ticks and grid, the series clipped to it, the axis labels. The y
// range covers the 1st to 99th percentile of the values so that a spike does not flatten the
// rest (the spike runs off the top); `y_floor`/`y_ceiling` pin an end (0 for rates, 100 %).
class Chart {
 public:
  static constexpr double kWidth = 500, kHeight = 270;
  static constexpr double kLeft = 62, kRight = 14, kTop = 30, kBottom = 44;

  std::string title, x_label, y_label;
  std::vector<Series> series;
  std::optional<double> y_floor, y_ceiling;

  // Values beyond this are drawn at it: the chart's differences of values stay finite, so
  // no coordinate is NaN (which a browser refuses to draw).
  static constexpr double kDrawable = 1e150;
  static double drawable(double v) { return std::clamp(v, -kDrawable, kDrawable); }

  std::string svg(int id) const {
    std::vector<double> xs, ys;
    for (const Series& s : series)
      for (const auto& [x, y] : s.points)
        if (std::isfinite(x) && std::isfinite(y))
          xs.push_back(drawable(x)), ys.push_back(drawable(y));
    std::ostringstream o;
    o << "<svg class=\"chart\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" role=\"img\" aria-label=\""
      << escape(title) << "\">\n<text class=\"title\" x=\"" << kLeft << "\" y=\"18\">"
      << escape(title) << "</text>\n";
    if (xs.empty()) {
      o << "<text class=\"empty\" x=\"" << kWidth / 2 << "\" y=\"" << kHeight / 2
        << "\" text-anchor=\"middle\">no data in these files</text>\n</svg>\n";
      return o.str();
    }
    double x0 = *std::min_element(xs.begin(), xs.end()),
           x1 = *std::max_element(xs.begin(), xs.end());
    double y0 = y_floor.value_or(quantile(ys, 0.01)), y1 = y_ceiling.value_or(quantile(ys, 0.99));
    if (x1 <= x0) x1 = x0 + 1;
    if (y1 <= y0) y1 = y0 + (y0 == 0 ? 1 : std::abs(y0) * 0.1);
    const double pad = 0.05 * (y1 - y0);
    if (!y_floor) y0 -= pad;
    if (!y_ceiling) y1 += pad;
    const double w = kWidth - kLeft - kRight, h = kHeight - kTop - kBottom;
    const auto px = [&](double x) { return kLeft + (drawable(x) - x0) / (x1 - x0) * w; };
    const auto py = [&](double y) { return kTop + (y1 - drawable(y)) / (y1 - y0) * h; };
    o << std::fixed << std::setprecision(1);
    o << "<clipPath id=\"clip" << id << "\"><rect x=\"" << kLeft << "\" y=\"" << kTop
      << "\" width=\"" << w << "\" height=\"" << h << "\"/></clipPath>\n";
    for (const double t : ticks(x0, x1, 6))
      o << "<line class=\"grid\" x1=\"" << px(t) << "\" x2=\"" << px(t) << "\" y1=\"" << kTop
        << "\" y2=\"" << kTop + h << "\"/><text class=\"tick\" x=\"" << px(t) << "\" y=\""
        << kTop + h + 14 << "\" text-anchor=\"middle\">" << fmt(t) << "</text>\n";
    for (const double t : ticks(y0, y1, 5))
      o << "<line class=\"grid\" x1=\"" << kLeft << "\" x2=\"" << kLeft + w << "\" y1=\"" << py(t)
        << "\" y2=\"" << py(t) << "\"/><text class=\"tick\" x=\"" << kLeft - 5 << "\" y=\""
        << py(t) + 3.5 << "\" text-anchor=\"end\">" << fmt(t) << "</text>\n";
    o << "<rect class=\"frame\" x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << w
      << "\" height=\"" << h << "\"/>\n<g clip-path=\"url(#clip" << id << ")\">\n";
    for (const Series& s : series) {
      if (s.points.empty()) continue;
      o << "<g><title>" << escape(s.label) << "</title>";
      if (!s.band_floor.empty()) {
        o << "<polygon fill=\"" << s.colour << "\" fill-opacity=\"0.55\" points=\"";
        for (const auto& [x, y] : s.points) o << px(x) << "," << py(y) << " ";
        for (auto it = s.band_floor.rbegin(); it != s.band_floor.rend(); ++it)
          o << px(it->first) << "," << py(it->second) << " ";
        o << "\"/>";
      }
      if (s.dots) {
        for (const auto& [x, y] : s.points)
          if (std::isfinite(y))
            o << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"2.6\" fill=\""
              << s.colour << "\" fill-opacity=\"" << s.opacity << "\"/>";
      }
      // A non-finite value breaks the line.
      std::string points;
      const auto flush = [&] {
        if (!points.empty())
          o << "<polyline fill=\"none\" stroke=\"" << s.colour << "\" stroke-width=\"" << s.width
            << "\" stroke-opacity=\"" << s.opacity << "\" stroke-linejoin=\"round\" points=\""
            << points << "\"/>";
        points.clear();
      };
      for (const auto& [x, y] : s.points) {
        if (!std::isfinite(y)) {
          flush();
          continue;
        }
        std::ostringstream p;
        p << std::fixed << std::setprecision(1) << px(x) << ","
          << py(std::clamp(y, y0 - (y1 - y0), y1 + (y1 - y0))) << " ";
        points += p.str();
      }
      flush();
      o << "</g>\n";
    }
    o << "</g>\n<text class=\"label\" x=\"" << kLeft + w / 2 << "\" y=\"" << kHeight - 6
      << "\" text-anchor=\"middle\">" << escape(x_label) << "</text>\n<text class=\"label\" "
      << "transform=\"translate(14," << kTop + h / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
      << escape(y_label) << "</text>\n</svg>\n";
    return o.str();
  }
};

// At most `limit` points: every k-th, always the last.
std::vector<std::pair<double, double>> thin(const std::vector<std::pair<double, double>>& points,
                                            std::size_t limit = 1500) {
  if (points.size() <= limit) return points;
  const std::size_t every = (points.size() + limit - 1) / limit;
  std::vector<std::pair<double, double>> out;
  for (std::size_t i = 0; i < points.size(); i += every) out.push_back(points[i]);
  if (out.back() != points.back()) out.push_back(points.back());
  return out;
}

// The trailing mean over `window` finite values.
std::vector<std::pair<double, double>> smooth(const std::vector<std::pair<double, double>>& points,
                                              std::size_t window) {
  std::vector<std::pair<double, double>> out;
  double sum = 0;
  std::vector<double> recent;
  for (const auto& [x, y] : points) {
    if (!std::isfinite(y)) continue;
    recent.push_back(y);
    sum += y;
    if (recent.size() > window) sum -= recent[recent.size() - window - 1];
    out.emplace_back(x, sum / static_cast<double>(std::min(recent.size(), window)));
  }
  return out;
}

enum class Axis { steps, seconds };

double x_of(const StepRecord& r, Axis axis) { return axis == Axis::steps ? r.step : r.seconds; }
const char* x_label(Axis axis) { return axis == Axis::steps ? "step" : "seconds"; }

Chart minibatch_loss(const std::vector<Run>& runs, Axis axis) {
  Chart c;
  c.title = std::string("minibatch loss against ") + x_label(axis);
  c.x_label = x_label(axis);
  c.y_label = "loss";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::vector<std::pair<double, double>> raw;
    for (const StepRecord& r : runs[i].steps)
      raw.emplace_back(x_of(r, axis), r.loss.value_or(std::nan("")));
    const std::size_t window = std::max<std::size_t>(1, raw.size() / 40);
    const std::string& colour = kColours[i % kColours.size()];
    c.series.push_back({runs[i].name + " (each step)", colour, thin(raw), 0.25, 1.0, false});
    c.series.push_back({runs[i].name + " (running mean of " + std::to_string(window) + " steps)",
                        colour, thin(smooth(raw, window)), 1.0, 1.8, false});
  }
  return c;
}

Chart validation(const std::vector<Run>& runs, Axis axis, bool accuracy) {
  Chart c;
  c.title =
      std::string("validation ") + (accuracy ? "accuracy" : "loss") + " against " + x_label(axis);
  c.x_label = x_label(axis);
  c.y_label = accuracy ? "accuracy (%)" : "loss";
  if (accuracy) c.y_ceiling = 100;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::vector<std::pair<double, double>> points;
    for (const StepRecord& r : runs[i].validations) {
      const std::optional<double> value = accuracy ? r.accuracy : r.loss;
      points.emplace_back(x_of(r, axis), value ? (accuracy ? 100 * *value : *value) : std::nan(""));
    }
    c.series.push_back({runs[i].name, kColours[i % kColours.size()], thin(points), 1.0, 1.8, true});
  }
  return c;
}

// Candidates scored per second of wall time (validations included), over windows of steps.
Chart throughput(const std::vector<Run>& runs, Axis axis) {
  Chart c;
  c.title = std::string("candidates per second against ") + x_label(axis);
  c.x_label = x_label(axis);
  c.y_label = "candidates / s";
  c.y_floor = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const std::vector<StepRecord>& s = runs[i].steps;
    const std::size_t window = std::clamp<std::size_t>(s.size() / 25, 1, 200);
    std::vector<std::pair<double, double>> points;
    for (std::size_t j = window; j < s.size(); ++j) {
      const double dt = s[j].seconds - s[j - window].seconds;
      // A resumed run's metrics continue the old ones: a step back in candidates is a restart.
      const double dc = s[j].candidates - s[j - window].candidates;
      if (dt > 0 && dc >= 0) points.emplace_back(x_of(s[j], axis), dc / dt);
    }
    c.series.push_back(
        {runs[i].name, kColours[i % kColours.size()], thin(points), 1.0, 1.6, false});
  }
  return c;
}

// The share of each step's candidates on each evaluation path, stacked, for one run.
std::string paths_chart(const Run& run, int id) {
  std::map<std::string, double> totals;
  for (const StepRecord& r : run.steps)
    for (const auto& [path, count] : r.paths) totals[path] += count;
  std::ostringstream o;
  if (totals.empty()) {
    o << "<p class=\"note\">" << escape(run.name)
      << ": no evaluation paths in this file (written before `polyprobe train` recorded "
         "them)</p>\n";
    return o.str();
  }
  std::vector<std::string> names;
  names.reserve(totals.size());
  for (const auto& [path, total] : totals) names.push_back(path);
  std::sort(names.begin(), names.end(),
            [&](const std::string& a, const std::string& b) { return totals[a] > totals[b]; });
  Chart frame;
  frame.title = run.name + ": candidates per path (stacked %)";
  frame.x_label = "step";
  frame.y_label = "share of candidates (%)";
  frame.y_floor = 0;
  frame.y_ceiling = 100;
  // Each path's line is the top of its band: the cumulative share up to and including it.
  const std::size_t every = std::max<std::size_t>(1, run.steps.size() / 1500);
  std::vector<std::vector<std::pair<double, double>>> tops(names.size());
  for (std::size_t j = 0; j < run.steps.size(); j += every) {
    const StepRecord& r = run.steps[j];
    double all = 0;
    for (const auto& [path, count] : r.paths) all += count;
    double cumulative = 0;
    for (std::size_t k = 0; k < names.size(); ++k) {
      const auto it = r.paths.find(names[k]);
      cumulative += it == r.paths.end() || all <= 0 ? 0 : it->second / all;
      tops[k].emplace_back(r.step, 100 * cumulative);
    }
  }
  for (std::size_t k = 0; k < names.size(); ++k) {
    std::ostringstream label;
    label << names[k] << " (" << std::fixed << std::setprecision(1)
          << 100 * totals[names[k]] /
                 std::accumulate(totals.begin(), totals.end(), 0.0,
                                 [](double sum, const auto& p) { return sum + p.second; })
          << " % of all)";
    std::vector<std::pair<double, double>> floor = k > 0 ? tops[k - 1] : tops[k];
    if (k == 0)
      for (auto& point : floor) point.second = 0;
    frame.series.push_back({label.str(), kColours[(k + 3) % kColours.size()], tops[k], 1.0, 1.2,
                            false, std::move(floor)});
  }
  o << frame.svg(id);
  o << "<div class=\"legend\">";
  for (const Series& s : frame.series)
    o << "<span><i style=\"background:" << s.colour << "\"></i>" << escape(s.label) << "</span>";
  o << "</div>\n";
  return o.str();
}

std::string summary_table(const std::vector<Run>& runs) {
  std::ostringstream o;
  o << "<table><tr><th></th><th>run</th><th>steps</th><th>seconds</th><th>candidates</th>"
       "<th>candidates / s</th><th>last minibatch loss</th><th>best validation accuracy</th>"
       "</tr>\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const Run& run = runs[i];
    const StepRecord* last = run.steps.empty() ? nullptr : &run.steps.back();
    const StepRecord* best = nullptr;
    for (const StepRecord& v : run.validations)
      if (v.accuracy && (best == nullptr || *v.accuracy > *best->accuracy)) best = &v;
    o << "<tr><td><i style=\"background:" << kColours[i % kColours.size()] << "\"></i></td><td>"
      << escape(run.name) << "</td>";
    if (last != nullptr)
      o << "<td>" << fmt(last->step, 10) << "</td><td>" << std::fixed << std::setprecision(1)
        << last->seconds << "</td><td>" << fmt(last->candidates, 12) << "</td><td>"
        << fmt(last->seconds > 0 ? last->candidates / last->seconds : 0, 3) << "</td><td>"
        << (last->loss ? fmt(*last->loss) : "-") << "</td>";
    else
      o << "<td colspan=\"5\">no training steps</td>";
    o << "<td>";
    if (best != nullptr)
      o << std::fixed << std::setprecision(1) << 100 * *best->accuracy << " % (step "
        << fmt(best->step, 10) << ")";
    else
      o << "-";
    o << "</td></tr>\n";
  }
  o << "</table>\n";
  return o.str();
}

std::string page(const std::vector<Run>& runs, const std::string& title) {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>"
    << escape(title)
    << "</title>\n<style>\n"
       "body{font:14px/1.4 sans-serif;color:#222;background:#fff;margin:16px 24px}\n"
       "h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:18px 0 6px}\n"
       ".grid2{display:flex;flex-wrap:wrap;gap:8px 16px}\n"
       ".chart .title{font-size:13px;font-weight:bold;fill:#222}\n"
       ".chart .tick{font-size:11px;fill:#555}.chart .label{font-size:12px;fill:#333}\n"
       ".chart .grid{stroke:#e4e4e4;stroke-width:1}.chart .frame{fill:none;stroke:#999}\n"
       ".chart .empty{font-size:13px;fill:#888}\n"
       ".legend{margin:4px 0 8px}.legend span{margin-right:18px;white-space:nowrap}\n"
       "i{display:inline-block;width:14px;height:4px;margin:0 6px 3px 0;vertical-align:middle}\n"
       "table{border-collapse:collapse}td,th{padding:2px 10px;text-align:right}\n"
       "td:nth-child(2),th:nth-child(2){text-align:left}tr:nth-child(even){background:#f4f4f4}\n"
       ".note{color:#666}\n</style>\n</head>\n<body>\n<h1>"
    << escape(title) << "</h1>\n<div class=\"legend\">";
  for (std::size_t i = 0; i < runs.size(); ++i)
    o << "<span><i style=\"background:" << kColours[i % kColours.size()] << "\"></i>"
      << escape(runs[i].name) << "</span>";
  o << "</div>\n" << summary_table(runs);
  int id = 0;
  const auto row = [&](const std::string& heading, const Chart& by_step, const Chart& by_time) {
    o << "<h2>" << escape(heading) << "</h2>\n<div class=\"grid2\">\n" << by_step.svg(id);
    o << by_time.svg(id + 1) << "</div>\n";
    id += 2;
  };
  row("Minibatch loss (faint: every step; line: running mean)", minibatch_loss(runs, Axis::steps),
      minibatch_loss(runs, Axis::seconds));
  row("Validation accuracy", validation(runs, Axis::steps, true),
      validation(runs, Axis::seconds, true));
  row("Validation loss", validation(runs, Axis::steps, false),
      validation(runs, Axis::seconds, false));
  row("Candidates scored per second of training (validations included)",
      throughput(runs, Axis::steps), throughput(runs, Axis::seconds));
  o << "<h2>Evaluation paths: the share of each step's candidates each path scored</h2>\n<div "
       "class=\"grid2\">\n";
  for (const Run& run : runs) o << "<div>" << paths_chart(run, id++) << "</div>\n";
  o << "</div>\n<p class=\"note\">Written by <code>polyprobe report</code> from ";
  for (std::size_t i = 0; i < runs.size(); ++i)
    o << (i ? ", " : "") << "<code>" << escape(runs[i].path) << "</code>";
  o << ".</p>\n</body>\n</html>\n";
  return o.str();
}

int run(Context& ctx) {
  const po::variables_map& vm = ctx.vm;
  if (!vm.count("metrics"))
    throw UsageError("no metrics file given (usage: polyprobe report METRICS.jsonl ... -o FILE)");
  if (!vm.count("output")) throw UsageError("no output file given: add -o report.html");
  const auto paths = vm["metrics"].as<std::vector<std::string>>();
  const fs::path output = vm["output"].as<std::string>();
  std::error_code ec;
  try {
    io::check_output_file(output, "-o file");
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  for (const std::string& path : paths)
    if (fs::exists(output, ec) && fs::exists(path, ec) && fs::equivalent(output, path, ec))
      throw UsageError("-o '" + output.string() + "' is the input '" + path +
                       "'; it would be overwritten: choose another output");
  const fs::path folder = fs::absolute(output, ec).parent_path();
  if (!fs::is_directory(folder, ec))
    throw Error("cannot write '" + output.string() + "': the folder '" + folder.string() +
                "' does not exist");
  std::vector<Run> runs;
  runs.reserve(paths.size());
  for (const std::string& path : paths) runs.push_back(read_run(path));
  name_runs(runs);
  const std::string title = vm.count("title")
                                ? vm["title"].as<std::string>()
                                : "polyprobe training report: " + std::to_string(runs.size()) +
                                      " run" + (runs.size() == 1 ? "" : "s");
  io::write_file_atomically(output, [&](std::ostream& file) { file << page(runs, title); });
  *ctx.out << "wrote " << output.string() << " (" << runs.size() << " run"
           << (runs.size() == 1 ? "" : "s") << ")\n";
  return 0;
}

}  // namespace

Command report_command() {
  Command c;
  c.name = "report";
  c.summary = "draw training runs from their --metrics files as one self-contained HTML page";
  c.description =
      "Reads the JSON lines of `polyprobe train --metrics` and writes one HTML page of inline\n"
      "SVG charts (no script, nothing fetched from the network): minibatch loss and\n"
      "validation accuracy and loss against steps and against seconds, candidates per\n"
      "second, and the share of candidates each evaluation path scored. Several files are\n"
      "overlaid, one colour per run, with a legend.\n\n"
      "examples:\n"
      "  polyprobe train --metrics relu.jsonl && polyprobe report relu.jsonl -o report.html\n"
      "  polyprobe train --model examples/models/sign_mlp.json --metrics sign.jsonl && polyprobe "
      "report relu.jsonl sign.jsonl -o compare.html";
  c.uses_plugins = false;
  c.options = [](po::options_description& o, po::positional_options_description& p) {
    o.add_options()("metrics", po::value<std::vector<std::string>>()->value_name("FILE"),
                    "metrics files (JSON lines) of `polyprobe train --metrics`, one run each")(
        "output,o", po::value<std::string>()->value_name("FILE"), "the HTML page to write")(
        "title", po::value<std::string>()->value_name("TEXT"), "the page's heading");
    p.add("metrics", -1);
  };
  c.run = run;
  return c;
}

}  // namespace polyprobe::app
