// Models from Python: model files and safetensors, the flat parameters as a numpy view,
// named tensors for PyTorch's state_dict, the forward pass, and explain().
#include "bindings.hpp"

#include <polyprobe/evaluator.hpp>
#include <polyprobe/loss.hpp>
#include <polyprobe/safetensors.hpp>

#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <random>

namespace polyprobe::python {
namespace {

namespace fs = std::filesystem;

py::object json_to_py(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}

std::string spec_text(py::handle spec) {
  if (py::isinstance<py::str>(spec)) return spec.cast<std::string>();
  if (py::isinstance<py::dict>(spec))
    return py::module_::import("json").attr("dumps")(spec).cast<std::string>();
  throw BadInput("a model spec is a dict or JSON text (docs/models.md)");
}

py::dict tensors_dict(const TensorFile& file) {
  py::dict out;
  for (const NamedTensor& t : file.tensors) {
    std::vector<py::ssize_t> shape(t.shape.begin(), t.shape.end());
    py::array_t<double> a(shape);
    std::copy(t.values.begin(), t.values.end(), a.mutable_data());
    out[py::str(t.name)] = a;
  }
  return out;
}

TensorFile tensor_file(const py::dict& tensors, const std::string& dtype) {
  TensorFile file;
  for (auto [key, value] : tensors) {
    NamedTensor t;
    t.name = py::str(key);
    // torch tensors: numpy reads them through __array__ (one conversion).
    py::object v = py::reinterpret_borrow<py::object>(value);
    if (py::hasattr(v, "detach")) v = v.attr("detach")().attr("cpu")();
    auto a = as_f64(v, ("tensor '" + t.name + "'").c_str());
    for (py::ssize_t i = 0; i < a.ndim(); ++i) t.shape.push_back(a.shape(i));
    t.values.assign(a.data(), a.data() + a.size());
    t.dtype = dtype;
    file.tensors.push_back(std::move(t));
  }
  return file;
}

template <class S>
py::array forward_as(const Model& model, py::handle x) {
  auto a = py::array_t<S, py::array::c_style | py::array::forcecast>::ensure(x);
  if (!a) {
    PyErr_Clear();
    throw BadInput("model(x): x must be an array of numbers");
  }
  const int64_t numel = model.input_shape().numel();
  if (a.ndim() < 1 || a.size() == 0 ||
      (a.ndim() == 1 ? a.shape(0) : a.size() / a.shape(0)) != numel) {
    std::string got = "(";
    // Appended piece by piece: `const char* + std::string` here draws a false -Wstringop-overflow
    // from GCC 12 under LTO.
    for (py::ssize_t i = 0; i < a.ndim(); ++i) {
      if (i > 0) got += ", ";
      got += std::to_string(a.shape(i));
    }
    throw BadInput("model(x): x must be a batch [B, " + model.input_shape().str().substr(1) +
                   " (or [B, " + std::to_string(numel) + "]), got shape " + got + ")");
  }
  const int64_t rows = a.ndim() == 1 ? 1 : a.shape(0);
  Eigen::Map<const Matrix<S>> in(a.data(), rows, numel);
  Matrix<S> out;
  without_gil([&] { out = model.template forward<S>(in); });
  py::array_t<S> result(
      {static_cast<py::ssize_t>(out.rows()), static_cast<py::ssize_t>(out.cols())});
  std::copy(out.data(), out.data() + out.size(), result.mutable_data());
  return result;
}

}  // namespace

EvaluatorRequest evaluator_request(const std::string& backend, const std::string& device,
                                   const std::string& dtype, int threads) {
  EvaluatorRequest request;
  request.backend = backend;
  request.device = device;
  request.options.dtype = bad_input([&] { return parse_dtype(dtype); });
  if (threads < 0) throw BadInput("threads must be >= 0");
  request.options.threads = threads;
  return request;
}

void bind_models(py::module_& m) {
  using Ptr = std::shared_ptr<PyModel>;
  py::class_<PyModel, Ptr>(m, "Model")
      .def(py::init([](py::handle spec, uint64_t seed) {
             const std::string text = spec_text(spec);
             auto p = std::make_shared<PyModel>(PyModel{bad_input(
                 [&] { return parse_model_file(text, "the model spec", plugins().layers); })});
             p->file.model.initialize(seed);
             return p;
           }),
           py::arg("spec"), py::arg("seed") = 0)
      .def_static(
          "_read",
          [](const fs::path& path) {
            return std::make_shared<PyModel>(
                PyModel{bad_input([&] { return read_model_file(path, plugins().layers); })});
          },
          py::arg("path"))
      .def(
          "initialize", [](PyModel& p, uint64_t seed) { p.file.model.initialize(seed); },
          py::arg("seed") = 0)
      .def("copy", [](const PyModel& p) { return std::make_shared<PyModel>(p); })
      .def_property_readonly(
          "spec",
          [](const PyModel& p) {
            return json_to_py(model_file_json(p.file.model, p.file.loss, p.file.l2));
          })
      .def_property(
          "loss", [](const PyModel& p) { return p.file.loss; },
          [](PyModel& p, const std::string& loss) {
            bad_input([&] { make_loss(loss); });
            p.file.loss = loss;
          })
      .def_property(
          "l2", [](const PyModel& p) { return p.file.l2; },
          [](PyModel& p, double l2) {
            if (!(l2 >= 0)) throw BadInput("l2 must be >= 0");
            p.file.l2 = l2;
          })
      .def_property_readonly("input_shape",
                             [](const PyModel& p) { return p.file.model.input_shape().dims; })
      .def_property_readonly("output_shape",
                             [](const PyModel& p) { return p.file.model.output_shape().dims; })
      .def_property_readonly(
          "dtype", [](const PyModel& p) { return std::string(to_string(p.file.model.dtype())); })
      .def_property_readonly("num_parameters",
                             [](const PyModel& p) { return p.file.model.num_parameters(); })
      .def_property_readonly("parameters",
                             [](py::object self) {
                               // A writable view of the flat float64 vector; `self` keeps it alive
                               // (the vector's size never changes after construction).
                               auto& p = self.cast<PyModel&>();
                               std::span<double> v = p.file.model.parameters();
                               return py::array_t<double>({static_cast<py::ssize_t>(v.size())},
                                                          {sizeof(double)}, v.data(), self);
                             })
      .def("_set_parameters",
           [](PyModel& p, py::handle values) {
             auto a = as_f64(values, "parameters");
             std::span<double> v = p.file.model.parameters();
             if (a.ndim() != 1 || a.shape(0) != static_cast<py::ssize_t>(v.size()))
               throw BadInput("parameters must be a vector of " + std::to_string(v.size()) +
                              " values");
             check_finite({a.data(), v.size()}, "parameters");
             std::copy(a.data(), a.data() + v.size(), v.begin());
           })
      .def("state_dict", [](const PyModel& p) { return tensors_dict(model_tensors(p.file.model)); })
      .def("load_state_dict",
           [](PyModel& p, const py::dict& tensors) {
             const TensorFile file = tensor_file(tensors, "F64");
             bad_input([&] { assign_model_tensors(p.file.model, file, "the state_dict"); });
           })
      .def("load_weights",
           [](PyModel& p, const fs::path& path) {
             bad_input([&] { load_weights(p.file.model, path); });
           })
      .def(
          "save_weights",
          [](const PyModel& p, const fs::path& path,
             const std::map<std::string, std::string>& metadata) {
            // A file that load_model and `polyprobe eval` would refuse is not written.
            const auto params = p.file.model.parameters();
            for (std::size_t i = 0; i < params.size(); ++i)
              if (!std::isfinite(params[i]))
                throw BadInput("save: parameter " + std::to_string(i) + " is " +
                               std::to_string(params[i]) +
                               "; weights that are not finite cannot be loaded back, so '" +
                               path.string() + "' is not written");
            TensorFile t = model_tensors(p.file.model);
            for (const auto& [k, v] : metadata) t.metadata[k] = v;
            write_safetensors(path, t);
          },
          py::arg("path"), py::arg("metadata") = std::map<std::string, std::string>{})
      .def("save_model_file",
           [](const PyModel& p, const fs::path& path) {
             write_model_file(path, p.file.model, p.file.loss, p.file.l2);
           })
      .def("__call__",
           [](const PyModel& p, py::handle x) {
             return p.file.model.dtype() == DType::f32 ? forward_as<float>(p.file.model, x)
                                                       : forward_as<double>(p.file.model, x);
           })
      .def(
          "forward",
          [](const PyModel& p, py::handle x, const std::string& dtype) {
            const DType d = bad_input([&] { return parse_dtype(dtype); });
            return d == DType::f32 ? forward_as<float>(p.file.model, x)
                                   : forward_as<double>(p.file.model, x);
          },
          py::arg("x"), py::arg("dtype"))
      .def(
          "explain",
          [](const PyModel& p, int32_t particle_dim, int64_t batch, const std::string& backend,
             const std::string& device, const std::string& dtype, int threads, uint64_t seed) {
            // One step's candidates (every particle at every simplex vertex) on a random
            // batch, as `polyprobe explain MODEL.json` runs them, so the counts are real.
            if (particle_dim <= 0 || batch <= 0)
              throw BadInput("explain: particle_dim and batch must be positive");
            const Model& model = p.file.model;
            const auto loss = bad_input([&] { return make_loss(p.file.loss, p.file.l2); });
            const EvaluatorRequest request = evaluator_request(backend, device, dtype, threads);
            Selection selection;
            nlohmann::json explained;
            without_gil([&] {
              auto evaluator = plugins().registry.make_evaluator(model, *loss, request, &selection);
              std::mt19937_64 rng(seed);
              std::normal_distribution<double> gauss;
              Batch b;
              b.inputs.resize(batch, model.input_shape().numel());
              for (Eigen::Index i = 0; i < b.inputs.size(); ++i) b.inputs.data()[i] = gauss(rng);
              const int64_t classes = model.output_shape().numel();
              if (loss->needs_labels())
                for (int64_t r = 0; r < batch; ++r)
                  b.targets.labels.push_back(
                      static_cast<int64_t>(rng() % static_cast<uint64_t>(classes)));
              else
                b.targets.values = Matrix<double>::Zero(batch, classes);
              evaluator->register_batch(b);
              const ParticleMap particles =
                  ParticleMap::contiguous(model.num_parameters(), particle_dim);
              std::vector<int64_t> particle;
              std::vector<double> displacement;
              std::normal_distribution<double> step(0.0, 5e-3);
              for (int64_t q = 0; q < particles.count(); ++q)
                for (int32_t v = 0; v <= particle_dim; ++v) {
                  particle.push_back(q);
                  for (int32_t k = 0; k < particle_dim; ++k) displacement.push_back(step(rng));
                }
              CandidateSet set{&particles, particle, displacement};
              std::vector<double> losses(particle.size());
              evaluator->evaluate(model.parameters(), set, losses);
              explained = evaluator->explain();
            });
            py::dict d;
            d["selection"] = json_to_py(selection.to_json());
            d["evaluator"] = json_to_py(explained);
            return d;
          },
          py::arg("particle_dim") = 2, py::arg("batch") = 64, py::arg("backend") = "auto",
          py::arg("device") = "cpu", py::arg("dtype") = "float32", py::arg("threads") = 0,
          py::arg("seed") = 1);

  m.def(
      "read_safetensors",
      [](const fs::path& path) {
        const TensorFile file = bad_input([&] { return read_safetensors(path); });
        return py::make_tuple(tensors_dict(file), file.metadata);
      },
      py::arg("path"));
  m.def(
      "write_safetensors",
      [](const fs::path& path, const py::dict& tensors,
         const std::map<std::string, std::string>& metadata, const std::string& dtype) {
        if (dtype != "F32" && dtype != "F64") throw BadInput("dtype must be 'F32' or 'F64'");
        TensorFile file = tensor_file(tensors, dtype);
        file.metadata = metadata;
        write_safetensors(path, file);
      },
      py::arg("path"), py::arg("tensors"), py::arg("metadata"), py::arg("dtype"));
}

}  // namespace polyprobe::python
