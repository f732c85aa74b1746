// Black-box optimisation from Python: minimize() over a Python callable and the batched
// ask/tell API, whose ask() is one numpy matrix so a vectorised objective scores a whole step.
#include "bindings.hpp"

#include <polyprobe/ask_tell.hpp>
#include <polyprobe/minimize.hpp>

#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <new>
#include <sstream>

namespace polyprobe::python {
namespace {

py::array_t<double> copy_vector(std::span<const double> v) {
  py::array_t<double> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

py::array_t<double> copy_matrix(const Matrix<double>& m) {
  py::array_t<double> out({static_cast<py::ssize_t>(m.rows()), static_cast<py::ssize_t>(m.cols())});
  std::copy(m.data(), m.data() + m.size(), out.mutable_data());
  return out;
}

py::dict step_dict(const StepInfo& s) {
  py::dict d;
  d["step"] = s.step;
  d["incumbent_loss"] = s.incumbent_loss;
  d["incumbent_measured"] = s.incumbent_measured;
  d["mean_cost"] = s.mean_cost;
  d["best_cost"] = s.best_cost;
  d["candidates"] = s.candidates;
  d["reverted"] = s.reverted;
  d["rejected"] = s.rejected;
  d["step_radius"] = s.step_radius;
  d["probe_radius"] = s.probe_radius;
  d["epsilon"] = s.epsilon;
  d["move_norm"] = s.move_norm;
  d["predicted_change"] = s.predicted_change;
  d["trust_ratio"] = s.trust_ratio;
  d["transport_iterations"] = s.transport_iterations;
  d["transport_converged"] = s.transport_converged;
  return d;
}

// The Python AskTell: the core optimizer, its configuration and the shape of its swarm.
class AskTell {
 public:
  AskTell(py::handle x0, py::handle config) {
    config_ = to_config(config);
    Matrix<double> start;
    if (!py::isinstance<py::array>(x0) && PyIndex_Check(x0.ptr()) && !PyBool_Check(x0.ptr())) {
      const auto dim = x0.cast<int64_t>();
      if (dim <= 0) throw BadInput("AskTell: dim must be positive, got " + std::to_string(dim));
      check_fits_memory(static_cast<double>(dim) * sizeof(double),
                        "AskTell: dim " + std::to_string(dim));
      start = Matrix<double>::Zero(1, dim);
    } else {
      auto a = as_f64(x0, "AskTell: x0");
      if (a.ndim() == 1) {
        start = Eigen::Map<const Matrix<double>>(a.data(), 1, a.shape(0));
      } else if (a.ndim() == 2) {
        start = Eigen::Map<const Matrix<double>>(a.data(), a.shape(0), a.shape(1));
      } else {
        throw BadInput("AskTell: x0 must be a vector (d,) or a swarm (P, d), got " +
                       std::to_string(a.ndim()) + " dimensions");
      }
      if (start.size() == 0) throw BadInput("AskTell: x0 is empty");
      check_finite({start.data(), static_cast<std::size_t>(start.size())}, "AskTell: x0");
    }
    if (start.cols() > std::numeric_limits<int32_t>::max())
      throw BadInput("AskTell: a particle of " + std::to_string(start.cols()) +
                     " coordinates is more than the optimizer's limit of " +
                     std::to_string(std::numeric_limits<int32_t>::max()));
    config_.particle_dim = static_cast<int32_t>(start.cols());
    bad_input([&] {
      config_.validate();
      try {
        opt_ = std::make_unique<AskTellOptimizer>(start, config_);
      } catch (const std::bad_alloc&) {
        throw out_of_memory("AskTell: " + std::to_string(start.rows()) + " particles of " +
                            std::to_string(start.cols()) + " coordinates");
      }
    });
    rows_ = start.rows();
  }

  py::array_t<double> ask() {
    const Matrix<double>* asked = nullptr;
    without_gil([&] { asked = &opt_->ask(); });
    asked_rows_ = asked->rows();
    return copy_matrix(*asked);
  }

  py::dict tell(py::handle losses, bool allow_nonfinite) {
    auto a = as_f64(losses, "tell: losses");
    if (asked_rows_ < 0) throw BadInput("tell() without a pending ask(); call ask() first");
    if (a.ndim() != 1 && !(a.ndim() == 2 && a.shape(1) == 1))
      throw BadInput("tell: losses must be a vector of " + std::to_string(asked_rows_) +
                     " values (one per asked row), got " + std::to_string(a.ndim()) +
                     " dimensions");
    if (a.shape(0) != asked_rows_)
      throw BadInput("tell: got " + std::to_string(a.shape(0)) + " losses for " +
                     std::to_string(asked_rows_) + " asked candidates");
    std::span<const double> values(a.data(), static_cast<std::size_t>(a.shape(0)));
    if (!allow_nonfinite)
      check_finite(values, "tell: losses");  // allow_nonfinite=True: scored as failures
    StepInfo info;
    without_gil([&] { info = opt_->tell(values); });
    asked_rows_ = -1;
    return step_dict(info);
  }

  py::dict state_dict() const {
    std::ostringstream out;
    opt_->save_state(out);
    py::dict d;
    d["format"] = "polyprobe.AskTell";
    d["version"] = 1;
    d["config"] = config_dict(config_);
    d["shape"] = py::make_tuple(rows_, config_.particle_dim);
    d["asked_rows"] = asked_rows_;
    d["state"] = py::bytes(out.str());
    return d;
  }

  void load_state_dict(const py::dict& d) {
    if (!d.contains("format") || !py::isinstance<py::str>(d["format"]) ||
        d["format"].cast<std::string>() != "polyprobe.AskTell")
      throw BadInput("load_state_dict: not an AskTell state_dict (no format 'polyprobe.AskTell')");
    for (const char* key : {"config", "shape", "asked_rows", "state"})
      if (!d.contains(key))
        throw BadInput(std::string("load_state_dict: the state_dict has no '") + key +
                       "' (it is damaged, or not from AskTell.state_dict())");
    if (!py::object(d["config"]).equal(config_dict(config_)))
      throw BadInput(
          "load_state_dict: the state was saved with another configuration; build the "
          "optimizer with AskTell.from_state_dict(state) or the same config");
    const auto shape = d["shape"].cast<std::pair<int64_t, int64_t>>();
    if (shape.first != rows_ || shape.second != config_.particle_dim)
      throw BadInput("load_state_dict: the state has " + std::to_string(shape.first) + " x " +
                     std::to_string(shape.second) + " particles, this optimizer " +
                     std::to_string(rows_) + " x " + std::to_string(config_.particle_dim));
    std::istringstream in(d["state"].cast<std::string>());
    bad_input([&] { opt_->load_state(in); });
    asked_rows_ = d["asked_rows"].cast<int64_t>();
  }

  const OptimizerConfig& config() const { return config_; }
  py::array_t<double> particles() const { return copy_matrix(opt_->particles()); }
  int64_t evaluations() const { return opt_->evaluations(); }
  double best_loss() const { return opt_->best_loss(); }
  py::array_t<double> best_point() const { return copy_vector(opt_->best_point()); }
  int64_t num_particles() const { return rows_; }

 private:
  OptimizerConfig config_;
  std::unique_ptr<AskTellOptimizer> opt_;
  int64_t rows_ = 0;
  int64_t asked_rows_ = -1;  // rows of the pending ask, -1 when none
};

py::dict minimize_py(const py::object& f, py::handle x0, int64_t budget, py::handle config,
                     bool allow_nonfinite) {
  if (!PyCallable_Check(f.ptr())) throw BadInput("minimize: f must be callable");
  auto a = as_f64(x0, "minimize: x0");
  if (a.ndim() != 1)
    throw BadInput("minimize: x0 must be a vector, got " + std::to_string(a.ndim()) +
                   " dimensions");
  if (a.shape(0) == 0) throw BadInput("minimize: x0 is empty");
  if (budget <= 0)
    throw BadInput("minimize: budget must be positive, got " + std::to_string(budget));
  std::vector<double> start(a.data(), a.data() + a.shape(0));
  check_finite(start, "minimize: x0");
  const OptimizerConfig c = to_config(config);
  int64_t calls = 0;
  Objective objective = [&](std::span<const double> x) {
    return with_gil([&] {
      py::object value = f(copy_vector(x));
      double v = 0;
      try {
        v = value.cast<double>();
      } catch (const py::cast_error&) {
        throw BadInput("minimize: f returned " +
                       std::string(py::str(py::type::handle_of(value).attr("__name__"))) +
                       ", not a number");
      }
      ++calls;
      if (!allow_nonfinite && !std::isfinite(v))
        throw BadInput("minimize: f returned " + std::to_string(v) + " at evaluation " +
                       std::to_string(calls) +
                       " (pass allow_nonfinite=True to score such points as failures)");
      return v;
    });
  };
  MinimizeResult r;
  bad_input([&] { c.validate(); });
  without_gil([&] { r = minimize(objective, start, budget, c); });
  py::dict d;
  d["x"] = copy_vector(r.x);
  d["f"] = r.f;
  d["evaluations"] = r.evaluations;
  d["steps"] = r.steps;
  return d;
}

}  // namespace

void bind_blackbox(py::module_& m) {
  m.def("minimize", &minimize_py, py::arg("f"), py::arg("x0"), py::arg("budget"),
        py::arg("config") = py::none(), py::arg("allow_nonfinite") = false,
        "Core minimize(); the package's polyprobe.minimize wraps it.");
  py::class_<AskTell>(m, "AskTell")
      .def(py::init<py::handle, py::handle>(), py::arg("x0"), py::arg("config") = py::none())
      .def("ask", &AskTell::ask)
      .def("tell", &AskTell::tell, py::arg("losses"), py::arg("allow_nonfinite") = false)
      .def("state_dict", &AskTell::state_dict)
      .def("load_state_dict", &AskTell::load_state_dict, py::arg("state"))
      .def_property_readonly("config", &AskTell::config)
      .def_property_readonly("particles", &AskTell::particles)
      .def_property_readonly("evaluations", &AskTell::evaluations)
      .def_property_readonly("best_loss", &AskTell::best_loss)
      .def_property_readonly("best_point", &AskTell::best_point)
      .def_property_readonly("num_particles", &AskTell::num_particles);
}

}  // namespace polyprobe::python
