// train() from Python: arrays become the core's Dataset, the options are `polyprobe train`'s
// (the package's polyprobe/_train_options.py holds the table and its defaults), progress calls
// back into Python with the GIL taken only for that call, and Ctrl-C stops between two steps.
#include "bindings.hpp"

#include <polyprobe/data.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/train.hpp>

#include <pybind11/stl.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <optional>
#include <sstream>

namespace polyprobe::python {
namespace {

// The class indices of `y` for a model of `classes` outputs, every one checked: integers (a
// float label must be a whole number: 2.5 or NaN is refused, never truncated) in range. Rows
// are numbered as in `y`.
std::vector<int64_t> class_labels(py::handle y, int64_t rows, int64_t classes,
                                  const std::string& what) {
  const py::array any = py::array::ensure(y);
  if (!any) {
    PyErr_Clear();
    throw BadInput("train: " + what + " labels must be an array of class indices");
  }
  if (any.ndim() != 1 || (rows >= 0 && any.shape(0) != rows))
    throw BadInput("train: " + what + " labels must be a vector of " +
                   (rows >= 0 ? std::to_string(rows) + " " : std::string()) + "class indices");
  const char kind = any.dtype().kind();
  if (kind != 'i' && kind != 'u' && kind != 'f')
    throw BadInput("train: " + what + " labels must be integers (class indices), got dtype " +
                   std::string(py::str(any.dtype())));
  // Each read in its own type: casting a float NaN to an integer is what hid it before (and
  // makes numpy warn).
  using Floats = py::array_t<double, py::array::c_style | py::array::forcecast>;
  using Integers = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
  const Floats values = kind == 'f' ? Floats::ensure(y) : Floats();
  const Integers integers = kind == 'f' ? Integers() : Integers::ensure(y);
  std::vector<int64_t> labels(static_cast<std::size_t>(any.shape(0)));
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const std::string where = "train: " + what + " label at row " + std::to_string(i);
    if (kind == 'f') {
      const double v = values.data()[i];
      if (!std::isfinite(v))
        throw BadInput(where + " is " + (std::isnan(v) ? "NaN" : "infinite") +
                       ", not a class index");
      std::ostringstream text;
      text << v;
      if (v != std::floor(v))
        throw BadInput(where + " is " + text.str() +
                       ", not a whole number (labels are class indices; it is not truncated)");
      if (v < 0 || v >= static_cast<double>(classes))
        throw BadInput(where + " is " + text.str() + ", not a class of the model's " +
                       std::to_string(classes) + " outputs");
      labels[i] = static_cast<int64_t>(v);
    } else {
      labels[i] = integers.data()[i];
      if (labels[i] < 0 || labels[i] >= classes)
        throw BadInput(where + " is " + std::to_string(labels[i]) +
                       ", not a class of the model's " + std::to_string(classes) + " outputs");
    }
  }
  return labels;
}

Dataset to_dataset(py::handle x, py::handle y, const Model& model, const std::string& what) {
  auto a = as_f64(x, ("train: " + what + " inputs").c_str());
  const int64_t numel = model.input_shape().numel();
  if (a.ndim() < 1 || a.shape(0) == 0 || a.size() / a.shape(0) != numel)
    throw BadInput("train: " + what + " inputs must be [n, " + std::to_string(numel) +
                   "] (or [n, " + model.input_shape().str().substr(1) + ")");
  Dataset d;
  d.name = what;
  d.sample_shape = model.input_shape();
  d.labels = class_labels(y, a.shape(0), model.output_shape().numel(), what);
  d.features = Eigen::Map<const Matrix<double>>(a.data(), a.shape(0), numel);
  check_finite({d.features.data(), static_cast<std::size_t>(d.features.size())},
               "train: " + what + " inputs");
  d.num_classes = model.output_shape().numel();
  return d;
}

template <class T>
T opt(const py::dict& o, const char* name) {
  return o[name].cast<T>();
}

py::dict train_py(PyModel& pm, py::handle x_train, py::handle y_train, py::handle x_val,
                  py::handle y_val, const py::dict& o, const py::object& progress) {
  Model& model = pm.file.model;
  DataSplits splits;
  splits.train = to_dataset(x_train, y_train, model, "training");
  splits.validation = to_dataset(x_val, y_val, model, "validation");
  splits.test = splits.validation;  // train() never reads it

  const std::string loss_name = o["loss"].is_none() ? pm.file.loss : opt<std::string>(o, "loss");
  const double l2 = o["l2"].is_none() ? pm.file.l2 : opt<double>(o, "l2");
  const auto loss = bad_input([&] { return make_loss(loss_name, l2); });

  TrainOptions options;
  options.epochs = opt<int64_t>(o, "epochs");
  options.batch_size = opt<int64_t>(o, "batch");
  const auto seed = opt<int64_t>(o, "seed");
  if (seed < 0) throw BadInput("train: seed must be >= 0, got " + std::to_string(seed));
  options.seed = static_cast<uint64_t>(seed);
  options.patience = opt<int64_t>(o, "patience");
  options.validate_every = opt<int64_t>(o, "validate_every");
  options.time_limit_s = opt<double>(o, "time_limit");
  // The rules of `polyprobe train`, in its words.
  if (options.epochs <= 0) throw BadInput("train: epochs must be positive");
  if (options.batch_size <= 0) throw BadInput("train: batch must be positive");
  if (options.validate_every < 0) throw BadInput("train: validate_every must be >= 0");
  if (options.patience < 0) throw BadInput("train: patience must be >= 0 (0: never stop early)");
  if (!(options.time_limit_s >= 0) || !std::isfinite(options.time_limit_s))
    throw BadInput("train: time_limit must be a number of seconds >= 0 (0: none), got " +
                   std::to_string(options.time_limit_s));
  const auto clock = opt<std::string>(o, "schedule_clock");
  if (clock != "steps" && clock != "time")
    throw BadInput("train: schedule_clock must be 'steps' or 'time', got '" + clock + "'");
  options.schedule_over_time = clock == "time";
  if (options.schedule_over_time && options.time_limit_s <= 0)
    throw BadInput("train: schedule_clock='time' runs the schedule over time_limit: set one");
  for (const char* output : {"metrics", "checkpoint"})
    if (!o[output].is_none() && opt<std::string>(o, output).empty())
      throw BadInput(std::string("train: ") + output +
                     " needs a file name, got an empty one (None writes no file)");
  if (!o["metrics"].is_none()) options.metrics_path = opt<std::string>(o, "metrics");
  if (!o["checkpoint"].is_none()) options.checkpoint_path = opt<std::string>(o, "checkpoint");
  options.resume = opt<bool>(o, "resume");
  if (options.resume && options.checkpoint_path.empty())
    throw BadInput("train: resume=True needs checkpoint=FILE");
  EvaluatorRequest request =
      evaluator_request(opt<std::string>(o, "backend"), opt<std::string>(o, "device"),
                        opt<std::string>(o, "dtype"), opt<int>(o, "threads"));
  options.dtype = request.options.dtype;
  request.options.candidate_dtype =
      bad_input([&] { return parse_candidate_dtype(opt<std::string>(o, "candidate_dtype")); });

  const int64_t steps_per_epoch =
      (splits.train.size() + options.batch_size - 1) / options.batch_size;
  // The optimizer options of `polyprobe train` (cmd_train.cpp's optimizer_config).
  py::dict optimizer = o["optimizer"].cast<py::dict>();
  optimizer["total_steps"] = options.epochs * steps_per_epoch;
  optimizer["seed"] = options.seed;
  const OptimizerConfig config = to_config(optimizer);
  if (config.radius.kind == RadiusModelKind::trust_region)
    throw BadInput(
        "train: radius_model='trust_region' needs one fixed objective, and minibatches change it "
        "every step; use fixed, adaptive or quadratic here, or AskTell/minimize");

  std::atomic<bool> stop{false};
  options.stop = &stop;
  std::vector<TrainProgress> records;
  std::optional<py::error_already_set> raised;
  options.on_progress = [&](const TrainProgress& p) {
    records.push_back(p);
    // Python is entered only for a progress function, or every few steps for Ctrl-C.
    if (progress.is_none() && p.step % 8 != 0 && !p.validation_accuracy) return;
    py::gil_scoped_acquire acquire;
    try {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (!progress.is_none()) {
        py::dict d;
        d["step"] = p.step;
        d["epoch"] = p.epoch;
        d["steps_per_epoch"] = p.steps_per_epoch;
        d["epochs"] = p.epochs;
        d["loss"] = p.loss;
        d["accuracy"] = p.accuracy;
        d["candidates"] = p.candidates;
        d["seconds"] = p.seconds;
        d["epsilon"] = p.epsilon;
        d["validation_accuracy"] =
            p.validation_accuracy ? py::cast(*p.validation_accuracy) : py::none();
        progress(d);
      }
    } catch (py::error_already_set& e) {
      if (!raised) raised.emplace(std::move(e));
      stop.store(true);
    }
  };

  Selection selection;
  TrainResult result;
  std::string evaluator_name;
  {
    py::gil_scoped_release release;
    PolytopeOptimizer optimizer_(model, config);
    auto evaluator = plugins().registry.make_evaluator(model, *loss, request, &selection);
    evaluator_name = evaluator->name();
    result = train(model, *loss, optimizer_, *evaluator, splits, options);
  }
  if (raised) throw *raised;

  py::list metrics;
  for (const TrainProgress& p : records) {
    py::dict d;
    d["step"] = p.step;
    d["epoch"] = p.epoch;
    d["loss"] = p.loss;
    d["accuracy"] = p.accuracy;
    d["candidates"] = p.candidates;
    d["seconds"] = p.seconds;
    d["epsilon"] = p.epsilon;
    d["validation_accuracy"] =
        p.validation_accuracy ? py::cast(*p.validation_accuracy) : py::none();
    metrics.append(d);
  }
  py::dict d;
  d["steps"] = result.steps;
  d["epochs_completed"] = result.epochs_completed;
  d["evaluations"] = result.evaluations;
  d["seconds"] = result.seconds;
  d["best_validation_accuracy"] = result.best_validation_accuracy;
  d["best_validation_loss"] = result.best_validation_loss;
  d["best_epoch"] = result.best_epoch;
  d["best_step"] = result.best_step;
  d["validations"] = result.validations;
  d["stopped_early"] = result.stopped_early;
  d["reached_time_limit"] = result.reached_time_limit;
  d["interrupted"] = result.interrupted;
  d["evaluator"] = evaluator_name;
  d["selection"] = py::module_::import("json").attr("loads")(selection.to_json().dump());
  d["metrics"] = metrics;
  return d;
}

}  // namespace

void bind_training(py::module_& m) {
  m.def(
      "check_labels",
      [](const PyModel& pm, py::handle y, const std::string& what) {
        (void)class_labels(y, -1, pm.file.model.output_shape().numel(), what);
      },
      py::arg("model"), py::arg("y"), py::arg("what"),
      "Raises ValueError naming the first label of `y` (rows as in `y`) that is not a class "
      "index of `model`.");
  m.def("train", &train_py, py::arg("model"), py::arg("x_train"), py::arg("y_train"),
        py::arg("x_val"), py::arg("y_val"), py::arg("options"), py::arg("progress"));
  m.def(
      "evaluate",
      [](const PyModel& pm, py::handle x, py::handle y, const std::string& dtype) {
        const Dataset data = to_dataset(x, y, pm.file.model, "evaluation");
        const auto loss = bad_input([&] { return make_loss(pm.file.loss, pm.file.l2); });
        const DType d = bad_input([&] { return parse_dtype(dtype); });
        EvaluationResult r;
        without_gil([&] { r = evaluate_model(pm.file.model, *loss, data, d); });
        py::dict out;
        out["loss"] = r.loss;
        out["accuracy"] = r.accuracy;
        out["samples"] = r.samples;
        return out;
      },
      py::arg("model"), py::arg("x"), py::arg("y"), py::arg("dtype") = "float32");
  m.def(
      "load_data",
      [](const std::string& name, uint64_t seed, double validation_fraction, double test_fraction) {
        SplitOptions split;
        split.seed = seed;
        split.validation_fraction = validation_fraction;
        split.test_fraction = test_fraction;
        PreparedData data = bad_input([&] { return prepare_data(name, split); });
        auto arrays = [](const Dataset& d) {
          py::array_t<double> x({static_cast<py::ssize_t>(d.features.rows()),
                                 static_cast<py::ssize_t>(d.features.cols())});
          std::copy(d.features.data(), d.features.data() + d.features.size(), x.mutable_data());
          py::array_t<int64_t> y(static_cast<py::ssize_t>(d.labels.size()));
          std::copy(d.labels.begin(), d.labels.end(), y.mutable_data());
          return py::make_tuple(x, y);
        };
        py::dict out;
        out["train"] = arrays(data.splits.train);
        out["validation"] = arrays(data.splits.validation);
        out["test"] = arrays(data.splits.test);
        out["sample_shape"] = data.splits.train.sample_shape.dims;
        out["num_classes"] = data.splits.train.num_classes;
        out["standardizer"] = data.standardizer.to_text();
        return out;
      },
      py::arg("name"), py::arg("seed"), py::arg("validation_fraction"), py::arg("test_fraction"));
}

}  // namespace polyprobe::python
