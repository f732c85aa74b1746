#include "bench_workloads.hpp"

#include <polyprobe/data.hpp>
#include <polyprobe/error.hpp>
#include <polyprobe/layer.hpp>

#include <Eigen/LU>
#include <Eigen/QR>
#include <nlohmann/json.hpp>

#include <cmath>
#include <random>

namespace polyprobe::app {

const std::vector<WorkloadSpec>& reference_workloads() {
  static const std::vector<WorkloadSpec> specs = {
      {"mlp64-full", {64, 64, 64, 10}, 32, 0, 2},
      {"mlp256-full", {64, 256, 256, 10}, 32, 0, 2},
      {"mlp256-sub512", {64, 256, 256, 10}, 32, 512, 8},
      {"mnist128-sub256", {784, 128, 10}, 64, 256, 8},
      {"mnist64-full", {784, 64, 10}, 64, 0, 2},
      {"conv-digits", {}, 32, 0, 2},
      {"cnn16-pool", {}, 64, 0, 2},
      {"attn-tokens", {}, 32, 0, 2},
      {"mnist128-rank8", {784, 128, 10}, 512, kNoBudget, 8, PolytopeKind::orthoplex},
      {"mnist128-factored-r2", {784, 128, 10}, 64, 0, 8, PolytopeKind::simplex, 2},
      {"mnist128-sub414", {784, 128, 10}, 64, 414, 8},
      {"mnist128-full", {784, 128, 10}, 64, 0, 2},
      {"mlp256-deep", {64, 256, 256, 256, 10}, 32, 0, 2},
      {"attn-long", {}, 8, 0, 2, PolytopeKind::simplex, 0, true},
      {"cheri-seq", {}, 64, 0, 2, PolytopeKind::simplex, 0, true},
      {"mnist128-factored-r32", {784, 128, 10}, 512, 0, 8, PolytopeKind::simplex, 32, true},
      {"wide-factored-r64", {3072, 256, 10}, 256, 0, 8, PolytopeKind::simplex, 64, true},
  };
  return specs;
}

const WorkloadSpec& find_workload(const std::string& name) {
  for (const WorkloadSpec& s : reference_workloads())
    if (s.name == name) return s;
  std::string known;
  for (const WorkloadSpec& s : reference_workloads()) known += (known.empty() ? "" : ", ") + s.name;
  throw Error("unknown workload '" + name + "' (workloads: " + known + ")");
}

namespace {

// The structured workloads (empty sizes): model, batch and labels.
void build_structured(Workload& w, std::mt19937_64& rng) {
  const LayerFactory factory = LayerFactory::with_builtins();
  const auto add = [&](const char* kind, const nlohmann::json& attrs) {
    w.model->add(factory.create(kind, attrs, w.model->output_shape()));
  };
  const int64_t batch = w.spec.batch;
  if (w.spec.name == "conv-digits") {
    w.model = std::make_unique<Model>(Shape{{1, 8, 8}}, DType::f32);
    add("conv2d", {{"out_channels", 8}, {"kernel_size", 3}, {"padding", 1}});
    add("relu", nlohmann::json::object());
    add("conv2d", {{"out_channels", 16}, {"kernel_size", 3}, {"stride", 2}, {"padding", 1}});
    add("relu", nlohmann::json::object());
    add("flatten", nlohmann::json::object());
    add("linear", {{"out_features", 10}});
    // The first `batch` digits, grey levels scaled to [0, 1].
    const Dataset digits = embedded_digits();
    w.batch.inputs = digits.features.topRows(batch) / 16.0;
    w.batch.targets.labels.assign(digits.labels.begin(), digits.labels.begin() + batch);
  } else if (w.spec.name == "cnn16-pool") {
    // The built-in cnn on Fashion-MNIST-sized images (random pixels in [0, 1]): its conv
    // particles run through the channel-local tail (relu, pool, flatten) into the linear layer.
    w.model = std::make_unique<Model>(Shape{{1, 28, 28}}, DType::f32);
    add("conv2d", {{"out_channels", 16}, {"kernel_size", 3}, {"padding", 1}});
    add("relu", nlohmann::json::object());
    add("max_pool2d", {{"kernel_size", 2}});
    add("flatten", nlohmann::json::object());
    add("linear", {{"out_features", 10}});
    std::uniform_real_distribution<double> pixel(0.0, 1.0);
    w.batch.inputs.resize(batch, int64_t{28} * 28);
    for (int64_t i = 0; i < w.batch.inputs.size(); ++i)
      w.batch.inputs.data()[i] = static_cast<float>(pixel(rng));
    for (int64_t r = 0; r < batch; ++r)
      w.batch.targets.labels.push_back(static_cast<int64_t>(rng() % 10));
  } else if (w.spec.name == "attn-tokens") {
    w.model = std::make_unique<Model>(Shape{{16, 32}}, DType::f32);
    add("self_attention", {{"num_heads", 4}});
    add("flatten", nlohmann::json::object());
    add("linear", {{"out_features", 10}});
    std::normal_distribution<double> gauss;
    w.batch.inputs.resize(batch, int64_t{16} * 32);
    for (int64_t i = 0; i < w.batch.inputs.size(); ++i)
      w.batch.inputs.data()[i] = static_cast<float>(gauss(rng));
    for (int64_t r = 0; r < batch; ++r)
      w.batch.targets.labels.push_back(static_cast<int64_t>(rng() % 10));
  } else if (w.spec.name == "attn-long" || w.spec.name == "cheri-seq") {
    // Sequences of 1024 positions: softmax self-attention over 32 features with 4 heads, or
    // the Cheri block of the seed's benchmark (128 channels, dilation 4, expansion 2); then a
    // per-position linear to one value, flatten, linear -> 10.
    const bool attention = w.spec.name == "attn-long";
    const int64_t length = 1024, features = attention ? 32 : 128;
    w.model = std::make_unique<Model>(Shape{{length, features}}, DType::f32);
    if (attention)
      add("self_attention", {{"num_heads", 4}});
    else
      add("cheri_block", {{"dilation", 4}, {"expansion", 2}});
    add("linear", {{"out_features", 1}});
    add("flatten", nlohmann::json::object());
    add("linear", {{"out_features", 10}});
    std::normal_distribution<double> gauss;
    w.batch.inputs.resize(batch, length * features);
    for (int64_t i = 0; i < w.batch.inputs.size(); ++i)
      w.batch.inputs.data()[i] = static_cast<float>(gauss(rng));
    for (int64_t r = 0; r < batch; ++r)
      w.batch.targets.labels.push_back(static_cast<int64_t>(rng() % 10));
  } else {
    throw Error("workload '" + w.spec.name + "' has no layer sizes and no structured model");
  }
}

}  // namespace

Workload build_workload(const WorkloadSpec& spec, uint64_t seed, const PluginRegistry* registry) {
  Workload w;
  w.spec = spec;
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<double> gauss;
  if (spec.sizes.empty()) {
    build_structured(w, rng);
    w.model->initialize(seed);
    for (double& p : w.model->parameters()) p = static_cast<double>(static_cast<float>(p));
    w.loss = make_loss("cross_entropy");
  } else {
    const LayerFactory factory = LayerFactory::with_builtins();
    w.model = std::make_unique<Model>(Shape{{spec.sizes[0]}}, DType::f32);
    for (std::size_t i = 1; i < spec.sizes.size(); ++i) {
      if (i > 1)
        w.model->add(factory.create("relu", nlohmann::json::object(), w.model->output_shape()));
      w.model->add(
          factory.create("linear", {{"out_features", spec.sizes[i]}}, w.model->output_shape()));
    }
    w.model->initialize(seed);
    // The network's float32 weights, as the reference workloads hold them.
    for (double& p : w.model->parameters()) p = static_cast<double>(static_cast<float>(p));
    w.loss = make_loss("cross_entropy");
    w.batch.inputs.resize(spec.batch, spec.sizes[0]);
    for (int64_t i = 0; i < w.batch.inputs.size(); ++i)
      w.batch.inputs.data()[i] = static_cast<float>(gauss(rng));
    for (int64_t r = 0; r < spec.batch; ++r)
      w.batch.targets.labels.push_back(
          static_cast<int64_t>(rng() % static_cast<uint64_t>(spec.sizes.back())));
  }

  const int32_t d = spec.d;
  int64_t dimension = w.model->num_parameters();
  if (spec.factored_rank > 0) {
    if (registry == nullptr)
      throw Error("workload '" + spec.name + "' needs the plugin factored_subspace");
    w.subspace = registry->make_subspace(*w.model, {"factored", spec.factored_rank, 0, seed + 3});
    dimension = w.subspace->dimension();
  } else if (spec.subspace_dim != 0) {
    HybridSubspace::Options options;
    options.rank = 8;
    options.max_subspace_dim = spec.subspace_dim > 0 ? spec.subspace_dim : 0;
    options.seed = seed + 3;
    w.subspace = HybridSubspace::from_layout(w.model->parameter_entries(),
                                             w.model->num_parameters(), options);
    dimension = w.subspace->dimension();
  }
  w.particles = ParticleMap::contiguous(dimension, d);

  // The template: polystep's regular simplex (or the orthoplex), centred and normalised.
  const Matrix<double> polytope = make_template(spec.polytope, d);
  w.vertices = static_cast<int32_t>(polytope.rows());
  w.simplex.assign(polytope.data(), polytope.data() + polytope.size());

  // Haar rotations: QR of a Gaussian matrix with the sign fix, det +1.
  const int64_t n_particles = w.particles.count();
  w.rotations.resize(static_cast<std::size_t>(n_particles * d * d));
  Eigen::MatrixXd g(d, d);
  for (int64_t p = 0; p < n_particles; ++p) {
    for (int32_t i = 0; i < d; ++i)
      for (int32_t j = 0; j < d; ++j) g(i, j) = gauss(rng);
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
    Eigen::MatrixXd q = qr.householderQ();
    for (int32_t j = 0; j < d; ++j)
      if (qr.matrixQR()(j, j) < 0) q.col(j) *= -1.0;
    if (q.determinant() < 0) q.col(0) *= -1.0;
    for (int32_t i = 0; i < d; ++i)
      for (int32_t j = 0; j < d; ++j)
        w.rotations[static_cast<std::size_t>((p * d + i) * d + j)] =
            static_cast<double>(static_cast<float>(q(i, j)));
  }
  w.particle.resize(static_cast<std::size_t>(n_particles * w.vertices));
  for (int64_t c = 0; c < static_cast<int64_t>(w.particle.size()); ++c)
    w.particle[static_cast<std::size_t>(c)] = c / w.vertices;
  w.displacement.resize(w.particle.size() * static_cast<std::size_t>(d));
  w.compute_displacements();
  return w;
}

void Workload::compute_displacements() {
  const int32_t d = spec.d;
  const double scale = 0.5 * 1e-2;
  for (std::size_t c = 0; c < particle.size(); ++c) {
    const double* r = rotations.data() + particle[c] * d * d;
    const double* t =
        simplex.data() + static_cast<int64_t>(c % static_cast<std::size_t>(vertices)) * d;
    double* out = displacement.data() + static_cast<int64_t>(c) * d;
    for (int32_t i = 0; i < d; ++i) {
      double sum = 0;
      for (int32_t k = 0; k < d; ++k) sum += r[i * d + k] * t[k];
      out[i] = scale * sum;
    }
  }
}

namespace {

// The widths of the affine layers: in_l, out_l for l = 0 .. L-1.
struct Dims {
  std::vector<double> in, out;
};
Dims dims(const WorkloadSpec& s) {
  Dims d;
  for (std::size_t i = 1; i < s.sizes.size(); ++i) {
    d.in.push_back(static_cast<double>(s.sizes[i - 1]));
    d.out.push_back(static_cast<double>(s.sizes[i]));
  }
  return d;
}

}  // namespace

double Workload::dense_flops() const {
  if (spec.sizes.empty()) return 0.0;  // structured models: not estimated
  // Every candidate: the GEMMs of its first changed layer and all later ones.
  const Dims dm = dims(spec);
  const double b = static_cast<double>(spec.batch), v = vertices;
  double total = 0;
  const auto& entries = model->parameter_entries();
  for (std::size_t l = 0; l < dm.in.size(); ++l) {
    double suffix = 0;
    for (std::size_t m = l; m < dm.in.size(); ++m) suffix += 2 * b * dm.in[m] * dm.out[m];
    const double params = static_cast<double>(entries[2 * l].size + entries[2 * l + 1].size);
    const double share = subspace ? 0.0 : params / spec.d;  // particles starting in layer l
    total += share * v * suffix;
  }
  if (subspace) {  // a subspace particle touches whole rows or columns: dense from its layer
    double suffix = 0;
    for (std::size_t m = 0; m < dm.in.size(); ++m) suffix += 2 * b * dm.in[m] * dm.out[m];
    total = static_cast<double>(candidates()) * suffix;
  }
  return total;
}

double Workload::delta_flops() const {
  if (spec.sizes.empty()) return 0.0;
  // Per candidate of a particle in layer l (one or two units change): its own terms
  // (2 d B), the ReLU delta (3 B), then to the logits: a column outer product (2 B out) when
  // the next affine layer is the last, the kink tables (2 B out + 2 B) when it is not, and
  // the cross-entropy (about 6 B C, an exp counted as one).
  const Dims dm = dims(spec);
  const double b = static_cast<double>(spec.batch), v = vertices, classes = dm.out.back();
  const double loss_flops = 6 * b * classes;
  if (subspace) return 0.0;  // not estimated (see bench_step.cpp)
  double total = 0;
  const auto& entries = model->parameter_entries();
  const std::size_t last = dm.in.size() - 1;
  for (std::size_t l = 0; l <= last; ++l) {
    const double params = static_cast<double>(entries[2 * l].size + entries[2 * l + 1].size);
    double per = 2 * spec.d * b + loss_flops;
    if (l < last) per += 3 * b + 2 * b * classes + (l + 1 < last ? 2 * b : 0);
    total += params / spec.d * v * per;
  }
  return total;
}

}  // namespace polyprobe::app
