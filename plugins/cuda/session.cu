// The CUDA evaluator session: batch, incumbent, effective weights and the incumbent's
// activations stay on the device; a score call uploads the step's directions, generates
// and scores every candidate on the device and copies the losses back once.
//
// A candidate changes the few raw parameters of one particle. Its first changed linear op
// starts from the incumbent's output there plus a sparse correction (prefix reuse and the
// sparse delta: dz[b, o] = sum (Q(w + d) - Q(w)) x[b, i] over its changed weights), then
// the activations run exactly on the corrected values and every later op runs densely, one
// GEMM over the whole chunk of candidates, corrected again where the particle also touches
// a later op (a particle may straddle two layers). In a subspace the changed parameters are
// the rows and columns of the particle's rank-one coordinates, with the same arithmetic as
// kernels::apply_subspace_move.
#include "device.hpp"
#include "kernels.cuh"
#include "model_plan.hpp"
#include "session.hpp"

#include <polyprobe/plugin/kernels/subspace_move.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace polyprobe::cuda {
namespace {

std::size_t sz(int64_t n) { return static_cast<std::size_t>(n); }

template <class T>
void gemm(cublasHandle_t h, int m, int n, int k, const T* a, const T* b, T* c);
template <>
void gemm<float>(cublasHandle_t h, int m, int n, int k, const float* a, const float* b, float* c) {
  const float one = 1.0f, zero = 0.0f;
  check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, k, b, k, &zero, c, m),
        "cublasSgemm");
}
template <>
void gemm<double>(cublasHandle_t h, int m, int n, int k, const double* a, const double* b,
                  double* c) {
  const double one = 1.0, zero = 0.0;
  check(cublasDgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, k, b, k, &zero, c, m),
        "cublasDgemm");
}

template <class T>
class DeviceSession final : public Session {
 public:
  DeviceSession(const pp_model_view& model, const pp_loss_view& loss,
                const pp_session_options& options)
      : plan_(make_plan(model, loss, options)),
        subspace_(options.subspace),
        device_(select_device(options.device_index)),
        stream_(PP_HAS_FIELD(&options, pp_session_options, stream) ? options.stream : nullptr),
        blas_(stream_.get()),
        chunk_option_(options.chunk_size) {
    const char* path = options.path;
    forced_ = path != nullptr && std::string_view(path) != "auto";
    std::vector<OpTransform> ops(plan_.ops.size(), OpTransform{0, 0, 0, 0, 1.0});
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      const OpPlan& op = plan_.ops[i];
      if (op.op == PP_OP_LINEAR)
        ops[i] = {op.param_offset, op.out * op.in, op.weight_transform, op.bias_transform,
                  op.quant_step};
    }
    ops_d_.upload(ops.data(), ops.size(), stream_.get());
    owner_d_.upload(plan_.owner.data(), plan_.owner.size(), stream_.get());
    theta_d_.resize(sz(plan_.n_params));
    eff_d_.resize(sz(plan_.n_params));
    if (subspace_ != nullptr) upload_subspace();
    stream_.synchronize();
  }

  void set_batch(const pp_batch_view& batch) override {
    use_device();
    const pp_tensor& in = batch.inputs;
    if (in.dtype != PP_DTYPE_F64 || in.device != PP_DEVICE_CPU || in.ndim != 2)
      throw std::invalid_argument("set_batch: inputs must be a [B, features] float64 host tensor");
    if (in.strides != nullptr && (in.strides[1] != 1 || in.strides[0] != in.shape[1]))
      throw std::invalid_argument("set_batch: inputs must be contiguous row-major");
    const int64_t rows = in.shape[0];
    if (rows <= 0) throw std::invalid_argument("set_batch: the batch is empty");
    if (in.shape[1] != plan_.in_features)
      throw std::invalid_argument("set_batch: inputs have " + std::to_string(in.shape[1]) +
                                  " features, the model expects " +
                                  std::to_string(plan_.in_features));
    const bool classification = plan_.loss != kernels::LossKind::mse;
    if (classification) {
      if (batch.labels.data == nullptr || batch.labels.dtype != PP_DTYPE_I64 ||
          pp_numel(batch.labels) != rows)
        throw std::invalid_argument("set_batch: this loss needs [B] int64 labels");
      const auto* labels = static_cast<const int64_t*>(batch.labels.data);
      for (int64_t r = 0; r < rows; ++r)
        if (labels[r] < 0 || labels[r] >= plan_.out_features)
          throw std::invalid_argument("set_batch: label " + std::to_string(labels[r]) +
                                      " is out of range");
      labels_d_.upload(labels, sz(rows), stream_.get());
      targets_d_.resize(0);
    } else {
      if (batch.targets.data == nullptr || batch.targets.dtype != PP_DTYPE_F64 ||
          pp_numel(batch.targets) != rows * plan_.out_features)
        throw std::invalid_argument("set_batch: mse needs [B, outputs] float64 targets");
      targets_d_.upload(static_cast<const double*>(batch.targets.data),
                        sz(rows * plan_.out_features), stream_.get());
      labels_d_.resize(0);
    }
    // Converted to the compute dtype once, here, as the core's reference casts its inputs.
    const auto* x = static_cast<const double*>(in.data);
    std::vector<T> converted(sz(rows * plan_.in_features));
    for (std::size_t i = 0; i < converted.size(); ++i) converted[i] = static_cast<T>(x[i]);
    batch_ = rows;
    acts_.resize(plan_.ops.size() + 1);
    acts_[0].upload(converted.data(), converted.size(), stream_.get());
    for (std::size_t i = 0; i < plan_.ops.size(); ++i)
      acts_[i + 1].resize(sz(rows * plan_.ops[i].out));
    // The host vector dies here: the copy must have read it.
    stream_.synchronize();
    prefix_dirty_ = true;
    chunk_cap_ = 0;
  }

  void set_particles(const pp_particle_layout& layout) override {
    use_device();
    if (layout.d < 1) throw std::invalid_argument("set_particles: d must be at least 1");
    if (layout.n_particles < 0) throw std::invalid_argument("set_particles: negative count");
    if (layout.n_vertices > 0 && layout.n_probes < 1)
      throw std::invalid_argument("set_particles: the probe count must be at least 1");
    const int64_t P = layout.n_particles;
    const int32_t d = layout.d;
    const int64_t limit = subspace_ != nullptr ? subspace_->dimension : plan_.n_params;
    std::vector<int64_t> coords(layout.coords, layout.coords + P * d);
    for (int64_t c : coords)
      if (c >= limit)
        throw std::invalid_argument("set_particles: coordinate " + std::to_string(c) +
                                    " is outside [0, " + std::to_string(limit) + ")");

    std::vector<int64_t> begin{0}, raw;
    std::vector<int32_t> op, row, col;
    first_op_.assign(sz(P), first_linear());
    last_op_.assign(sz(P), -1);
    int64_t widest = 1;
    for (int64_t p = 0; p < P; ++p) {
      std::set<int64_t> touched;
      for (int32_t j = 0; j < d; ++j) {
        const int64_t k = coords[sz(p * d + j)];
        if (k < 0) continue;
        if (subspace_ == nullptr) {
          touched.insert(k);
          continue;
        }
        const pp_subspace_coord& q = subspace_->coords[k];
        for (int64_t r = 0; r < q.rows; ++r) {
          const double ur = q.row >= 0 ? (r == q.row ? 1.0 : 0.0) : q.u[r];
          if (ur == 0.0) continue;
          if (q.col >= 0)
            touched.insert(q.offset + r * q.cols + q.col);
          else
            for (int64_t i = 0; i < q.cols; ++i) touched.insert(q.offset + r * q.cols + i);
        }
      }
      int32_t first = -1, last = -1;
      for (int64_t t : touched) {
        const int32_t o = plan_.owner[sz(t)];
        if (o < 0) continue;  // no parameter of any op: nothing to change
        const OpPlan& lin = plan_.ops[sz(o)];
        const int64_t local = t - lin.param_offset;
        raw.push_back(t);
        op.push_back(o);
        if (local < lin.out * lin.in) {
          row.push_back(static_cast<int32_t>(local / lin.in));
          col.push_back(static_cast<int32_t>(local % lin.in));
        } else {
          row.push_back(static_cast<int32_t>(local - lin.out * lin.in));
          col.push_back(-1);
        }
        first = first < 0 ? o : std::min(first, o);
        last = std::max(last, o);
      }
      begin.push_back(static_cast<int64_t>(raw.size()));
      widest = std::max(widest, begin.back() - begin[begin.size() - 2]);
      if (first >= 0) first_op_[sz(p)] = first;
      last_op_[sz(p)] = last;
    }
    cudaStream_t s = stream_.get();
    coords_d_.upload(coords.data(), coords.size(), s);
    elem_begin_d_.upload(begin.data(), begin.size(), s);
    elem_raw_d_.upload(raw.data(), raw.size(), s);
    elem_op_d_.upload(op.data(), op.size(), s);
    elem_row_d_.upload(row.data(), row.size(), s);
    elem_col_d_.upload(col.data(), col.size(), s);
    stream_.synchronize();
    // A coordinate that two particles share would make the device move race; then the
    // host's moved mirror is uploaded instead.
    std::vector<int64_t> sorted;
    for (int64_t c : coords)
      if (c >= 0) sorted.push_back(c);
    std::sort(sorted.begin(), sorted.end());
    unique_coords_ = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
    coords_h_ = std::move(coords);
    d_ = d;
    particles_ = P;
    vertices_ = layout.n_vertices;
    probes_ = std::max(1, layout.n_probes);
    elem_max_ = widest;
    has_particles_ = true;
    chunk_cap_ = 0;
  }

  void set_incumbent(const pp_tensor& theta) override {
    use_device();
    if (theta.dtype != PP_DTYPE_F64 || theta.device != PP_DEVICE_CPU ||
        pp_numel(theta) != plan_.n_params)
      throw std::invalid_argument("set_incumbent: theta must be [" +
                                  std::to_string(plan_.n_params) + "] float64 in host memory");
    const auto* data = static_cast<const double*>(theta.data);
    theta_h_.assign(data, data + plan_.n_params);
    theta_d_.upload(theta_h_.data(), theta_h_.size(), stream_.get());
    incumbent_changed();
  }

  void move_incumbent(const double* moves) override {
    use_device();
    if (theta_h_.empty() && plan_.n_params > 0)
      throw std::logic_error("move_incumbent before set_incumbent");
    if (!has_particles_) throw std::logic_error("move_incumbent before set_particles");
    const int64_t n = particles_ * d_;
    if (subspace_ == nullptr) {
      // The host's arithmetic: theta[coord] += move, in double, on both copies.
      for (int64_t c = 0; c < n; ++c)
        if (coords_h_[sz(c)] >= 0) theta_h_[sz(coords_h_[sz(c)])] += moves[c];
      if (unique_coords_) {
        moves_d_.upload(moves, sz(n), stream_.get());
        launch_move(coords_d_.data(), moves_d_.data(), n, theta_d_.data(), stream_.get());
      } else {
        theta_d_.upload(theta_h_.data(), theta_h_.size(), stream_.get());
      }
    } else {
      // RankOneSubspace::apply's order and arithmetic, then the whole mirror goes up, so
      // the device copy is the host's bit for bit.
      for (int64_t c = 0; c < n; ++c) {
        const int64_t k = coords_h_[sz(c)];
        if (k >= 0) kernels::apply_subspace_move(subspace_->coords[k], moves[c], theta_h_.data());
      }
      theta_d_.upload(theta_h_.data(), theta_h_.size(), stream_.get());
    }
    // moves and theta_h_ are read by the copies above before we return.
    stream_.synchronize();
    incumbent_changed();
  }

  void score(const pp_score_request& request, double* losses, double* incumbent_loss) override {
    use_device();
    if (batch_ == 0) throw std::logic_error("score before set_batch");
    if (theta_h_.empty() && plan_.n_params > 0)
      throw std::logic_error("score before set_incumbent");
    cudaStream_t s = stream_.get();
    CandidateSource src{};
    src.d = d_;
    int64_t count = 0, outputs = 0;
    std::vector<int64_t> active;
    if (request.form == PP_CANDIDATES_POLYTOPE) {
      if (!has_particles_ || vertices_ <= 0)
        throw std::logic_error("score: the bound particles have no polytope");
      for (int64_t p = 0; p < particles_; ++p)
        if (request.active == nullptr || request.active[p] != 0) active.push_back(p);
      active_d_.upload(active.data(), active.size(), s);
      dir_d_.upload(request.directions, sz(particles_ * vertices_ * d_), s);
      src.polytope = 1;
      src.active = active_d_.data();
      src.directions = dir_d_.data();
      src.probe_radius = request.probe_radius;
      src.vertices = vertices_;
      src.probes = probes_;
      count = static_cast<int64_t>(active.size()) * vertices_ * probes_;
      outputs = particles_ * vertices_ * probes_;
    } else if (request.form == PP_CANDIDATES_EXPLICIT) {
      count = request.count;
      if (count < 0) throw std::invalid_argument("score: negative candidate count");
      if (count > 0 && !has_particles_) throw std::logic_error("score before set_particles");
      for (int64_t c = 0; c < count; ++c)
        if (request.particle[c] < 0 || request.particle[c] >= particles_)
          throw std::invalid_argument("score: candidate " + std::to_string(c) + " names particle " +
                                      std::to_string(request.particle[c]));
      particle_d_.upload(request.particle, sz(count), s);
      disp_d_.upload(request.displacement, sz(count * d_), s);
      src.particle = particle_d_.data();
      src.displacement = disp_d_.data();
      outputs = count;
    } else {
      throw std::invalid_argument("score: unknown candidate form " + std::to_string(request.form));
    }
    losses_d_.reserve(sz(outputs + 1));
    refresh_prefix();

    const auto particle_of = [&](int64_t g) {
      return src.polytope ? active[sz(g / (int64_t{vertices_} * probes_))] : request.particle[g];
    };
    int64_t g = 0;
    while (g < count) {
      const int64_t cap = chunk_capacity();
      // A chunk: consecutive candidates whose first changed op is the same.
      const int32_t first = first_op_[sz(particle_of(g))];
      int32_t last = -1;
      int64_t end = g;
      while (end < count && end - g < cap && first_op_[sz(particle_of(end))] == first) {
        last = std::max(last, last_op_[sz(particle_of(end))]);
        ++end;
      }
      src.first = g;
      try {
        run_chunk(src, end - g, first, last);
      } catch (const OutOfMemory&) {
        if (end - g <= 1) throw;
        // Halve and retry; the buffers of the failed size are let go first.
        chunk_cap_ = std::max<int64_t>(1, (end - g) / 2);
        release_chunk_buffers();
        continue;
      }
      g = end;
    }
    if (incumbent_loss != nullptr) incumbent_objective(losses_d_.data() + outputs);

    staging_.resize(sz(outputs + 1));
    check(cudaMemcpyAsync(staging_.data(), losses_d_.data(), sz(outputs + 1) * sizeof(double),
                          cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync losses to host");
    stream_.synchronize();
    if (src.polytope) {
      // Entries of inactive particles stay as the caller left them.
      const int64_t vk = int64_t{vertices_} * probes_;
      for (int64_t p : active) std::copy_n(staging_.begin() + p * vk, vk, losses + p * vk);
    } else {
      std::copy_n(staging_.begin(), count, losses);
    }
    if (incumbent_loss != nullptr) *incumbent_loss = staging_[sz(outputs)];
    last_count_ = count;
  }

  void read_incumbent(pp_tensor& theta) override {
    use_device();
    if (theta.dtype != PP_DTYPE_F64 || theta.device != PP_DEVICE_CPU ||
        pp_numel(theta) != plan_.n_params)
      throw std::invalid_argument("read_incumbent: theta must be [" +
                                  std::to_string(plan_.n_params) + "] float64 in host memory");
    // The device copy, not the mirror: this is what the candidates were scored around.
    check(cudaMemcpyAsync(theta.data, theta_d_.data(), sz(plan_.n_params) * sizeof(double),
                          cudaMemcpyDeviceToHost, stream_.get()),
          "cudaMemcpyAsync incumbent to host");
    stream_.synchronize();
  }

  const char* explain() override {
    std::ostringstream j;
    const bool sub = subspace_ != nullptr;
    const char* path = sub ? "subspace-delta" : "sparse";
    j << "{\"evaluator\":\"cuda\",\"device\":\"" << device_name() << "\",\"dtype\":\""
      << (sizeof(T) == 4 ? "float32" : "float64") << "\",\"path\":\"" << path << "\""
      << ",\"forced\":" << (forced_ ? "true" : "false") << ",\"chunk\":" << chunk_cap_
      << ",\"last_candidates\":" << last_count_ << ",\"device_bytes\":" << DeviceMemory::live()
      << ",\"device_peak_bytes\":" << DeviceMemory::peak() << ",\"layers\":[";
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      const OpPlan& op = plan_.ops[i];
      if (i > 0) j << ",";
      j << "{\"layer\":" << i << ",\"op\":\"" << (op.op == PP_OP_LINEAR ? "linear" : "activation")
        << "\",\"path\":\"";
      if (op.op == PP_OP_LINEAR)
        j << path
          << ": first changed layer = incumbent output + sparse correction over the changed "
             "weights (Q(w+d)-Q(w)) x; later layers one cuBLAS GEMM over the chunk";
      else
        j << "elementwise, exact f(z + dz) on the corrected pre-activations";
      j << "\"}";
    }
    j << "],\"declined\":{\"dense\":\"materialised-weight batched GEMM path not implemented yet\"";
    if (sub)
      j << ",\"sparse\":\"the particles move subspace coordinates\"";
    else
      j << ",\"subspace-delta\":\"no subspace\"";
    j << "}}";
    explain_ = j.str();
    return explain_.c_str();
  }

 private:
  static int64_t pp_numel(const pp_tensor& t) {
    int64_t n = 1;
    for (int32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
    return n;
  }
  static int select_device(int32_t index) {
    check(cudaSetDevice(index), "cudaSetDevice");
    return index;
  }
  void use_device() const { check(cudaSetDevice(device_), "cudaSetDevice"); }
  std::string device_name() const {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess)
      return "cuda:" + std::to_string(device_);
    return std::string(prop.name) + " (cuda:" + std::to_string(device_) + ")";
  }
  int32_t first_linear() const {
    for (std::size_t i = 0; i < plan_.ops.size(); ++i)
      if (plan_.ops[i].op == PP_OP_LINEAR) return static_cast<int32_t>(i);
    return -1;
  }

  void upload_subspace() {
    // Basis vectors are shared by many coordinates: each distinct one goes up once.
    std::map<const double*, int64_t> where;
    std::vector<double> basis;
    std::vector<DeviceCoord> coords(sz(subspace_->dimension));
    auto place = [&](const double* v, int64_t n) -> int64_t {
      auto [it, fresh] = where.try_emplace(v, static_cast<int64_t>(basis.size()));
      if (fresh) basis.insert(basis.end(), v, v + n);
      return it->second;
    };
    for (int64_t k = 0; k < subspace_->dimension; ++k) {
      const pp_subspace_coord& q = subspace_->coords[k];
      if (q.offset < 0 || q.rows < 0 || q.cols < 0 || q.offset + q.rows * q.cols > plan_.n_params)
        throw std::invalid_argument("subspace coordinate " + std::to_string(k) +
                                    " lies outside the parameters");
      coords[sz(k)] = {q.offset,
                       q.rows,
                       q.cols,
                       q.row,
                       q.col,
                       q.row >= 0 ? -1 : place(q.u, q.rows),
                       q.col >= 0 ? -1 : place(q.v, q.cols)};
    }
    sub_coords_d_.upload(coords.data(), coords.size(), stream_.get());
    basis_d_.upload(basis.data(), basis.size(), stream_.get());
  }

  void incumbent_changed() {
    sum_sq_ = std::inner_product(theta_h_.begin(), theta_h_.end(), theta_h_.begin(), 0.0);
    prefix_dirty_ = true;
  }

  ParticleTable table() {
    ParticleTable t{};
    t.d = d_;
    t.coords = coords_d_.data();
    t.elem_begin = elem_begin_d_.data();
    t.elem_raw = elem_raw_d_.data();
    t.elem_op = elem_op_d_.data();
    t.elem_row = elem_row_d_.data();
    t.elem_col = elem_col_d_.data();
    t.elem_max = elem_max_;
    t.subspace = subspace_ != nullptr ? sub_coords_d_.data() : nullptr;
    t.basis = basis_d_.data();
    return t;
  }

  void linear(std::size_t i, const T* x, int64_t rows, T* y) {
    const OpPlan& op = plan_.ops[i];
    const T* w = eff_d_.data() + op.param_offset;
    gemm<T>(blas_.get(), static_cast<int>(op.out), static_cast<int>(rows), static_cast<int>(op.in),
            w, x, y);
    if (op.bias) launch_add_bias<T>(y, w + op.out * op.in, rows, op.out, stream_.get());
  }

  // The incumbent's effective weights and its activations at every op boundary.
  void refresh_prefix() {
    if (!prefix_dirty_) return;
    cudaStream_t s = stream_.get();
    launch_effective<T>(theta_d_.data(), owner_d_.data(), ops_d_.data(), plan_.n_params,
                        eff_d_.data(), s);
    for (std::size_t i = 0; i < plan_.ops.size(); ++i) {
      const OpPlan& op = plan_.ops[i];
      if (op.op == PP_OP_LINEAR)
        linear(i, acts_[i].data(), batch_, acts_[i + 1].data());
      else
        launch_activation<T>(acts_[i].data(), acts_[i + 1].data(), batch_ * op.out, op.fn, op.step,
                             s);
    }
    prefix_dirty_ = false;
  }

  int64_t bytes_per_candidate() const {
    return batch_ * (2 * plan_.max_width + 1) * int64_t{sizeof(T)} +
           elem_max_ * int64_t{sizeof(T) + sizeof(double)} + int64_t{sizeof(double)};
  }

  int64_t chunk_capacity() {
    if (chunk_cap_ > 0) return chunk_cap_;
    int64_t cap = chunk_option_;
    if (cap <= 0) {
      std::size_t free_bytes = 0, total_bytes = 0;
      check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
      // Half of what is free now: cuBLAS workspaces and other sessions need room too.
      cap = static_cast<int64_t>(free_bytes / 2) / std::max<int64_t>(1, bytes_per_candidate());
      cap = std::min<int64_t>(cap, int64_t{1} << 20);
    }
    // cuBLAS takes int dimensions: rows = candidates x batch must fit.
    const int64_t rows_limit = (int64_t{1} << 31) - 1;
    cap = std::min(cap, rows_limit / std::max<int64_t>(1, batch_ * plan_.max_width));
    chunk_cap_ = std::max<int64_t>(1, cap);
    return chunk_cap_;
  }

  void release_chunk_buffers() {
    buf_a_.resize(0);
    buf_b_.resize(0);
    per_.resize(0);
    dq_.resize(0);
    l2_terms_.resize(0);
    l2c_.resize(0);
  }

  void run_chunk(const CandidateSource& src, int64_t count, int32_t first, int32_t last) {
    cudaStream_t s = stream_.get();
    const int64_t rows = count * batch_;
    buf_a_.reserve(sz(rows * plan_.max_width));
    buf_b_.reserve(sz(rows * plan_.max_width));
    per_.reserve(sz(rows));
    dq_.reserve(sz(count * elem_max_));
    l2_terms_.reserve(sz(count * elem_max_));
    l2c_.reserve(sz(count));
    const ParticleTable t = table();
    launch_deltas<T>(src, t, count, theta_d_.data(), ops_d_.data(), eff_d_.data(), dq_.data(),
                     l2_terms_.data(), l2c_.data(), s);
    T* cur = buf_a_.data();
    T* other = buf_b_.data();
    const OpPlan& f = plan_.ops[sz(first)];
    // Prefix reuse: the first changed op starts from the incumbent's own output and input.
    launch_broadcast<T>(acts_[sz(first) + 1].data(), batch_, f.out, count, cur, s);
    launch_correct<T>(src, t, count, first, dq_.data(), acts_[sz(first)].data(), 0, f.in, cur,
                      f.out, batch_, s);
    for (std::size_t i = sz(first) + 1; i < plan_.ops.size(); ++i) {
      const OpPlan& op = plan_.ops[i];
      if (op.op == PP_OP_ACTIVATION) {
        if (op.fn != PP_ACT_IDENTITY)
          launch_activation<T>(cur, cur, rows * op.out, op.fn, op.step, s);
        continue;
      }
      linear(i, cur, rows, other);
      if (static_cast<int32_t>(i) <= last)
        launch_correct<T>(src, t, count, static_cast<int32_t>(i), dq_.data(), cur, batch_ * op.in,
                          op.in, other, op.out, batch_, s);
      std::swap(cur, other);
    }
    launch_sample_losses<T>(cur, rows, plan_.out_features, batch_, static_cast<int32_t>(plan_.loss),
                            labels_d_.data(), targets_d_.data(), per_.data(), s);
    launch_objective<T>(src, count, per_.data(), batch_, plan_.l2, sum_sq_, l2c_.data(),
                        losses_d_.data(), s);
  }

  void incumbent_objective(double* slot) {
    per_.reserve(sz(batch_));
    CandidateSource one{};
    launch_sample_losses<T>(acts_.back().data(), batch_, plan_.out_features, batch_,
                            static_cast<int32_t>(plan_.loss), labels_d_.data(), targets_d_.data(),
                            per_.data(), stream_.get());
    launch_objective<T>(one, 1, per_.data(), batch_, plan_.l2, sum_sq_, nullptr, slot,
                        stream_.get());
  }

  ModelPlan plan_;
  const pp_subspace_view* subspace_;
  int device_;
  Stream stream_;
  Blas blas_;
  int64_t chunk_option_;
  bool forced_ = false;

  DeviceBuffer<OpTransform> ops_d_;
  DeviceBuffer<int32_t> owner_d_;
  DeviceBuffer<DeviceCoord> sub_coords_d_;
  DeviceBuffer<double> basis_d_;

  int64_t batch_ = 0;
  DeviceBuffer<int64_t> labels_d_;
  DeviceBuffer<double> targets_d_;
  std::vector<DeviceBuffer<T>> acts_;  // acts_[0] = inputs, acts_[i + 1] = output of op i

  bool has_particles_ = false, unique_coords_ = true;
  int32_t d_ = 1, vertices_ = 0, probes_ = 1;
  int64_t particles_ = 0, elem_max_ = 1;
  std::vector<int64_t> coords_h_;
  std::vector<int32_t> first_op_, last_op_;
  DeviceBuffer<int64_t> coords_d_, elem_begin_d_, elem_raw_d_;
  DeviceBuffer<int32_t> elem_op_d_, elem_row_d_, elem_col_d_;

  std::vector<double> theta_h_;  // the host mirror, moved with the host's arithmetic
  DeviceBuffer<double> theta_d_;
  DeviceBuffer<T> eff_d_;
  double sum_sq_ = 0.0;
  bool prefix_dirty_ = true;

  DeviceBuffer<int64_t> active_d_, particle_d_;
  DeviceBuffer<double> dir_d_, disp_d_, moves_d_, losses_d_;
  std::vector<double> staging_;
  DeviceBuffer<T> buf_a_, buf_b_, per_, dq_;
  DeviceBuffer<double> l2_terms_, l2c_;
  int64_t chunk_cap_ = 0, last_count_ = 0;
  std::string explain_;
};

}  // namespace

std::unique_ptr<Session> make_session(const pp_model_view& model, const pp_loss_view& loss,
                                      const pp_session_options& options) {
  if (options.dtype == PP_DTYPE_F32)
    return std::make_unique<DeviceSession<float>>(model, loss, options);
  return std::make_unique<DeviceSession<double>>(model, loss, options);
}

}  // namespace polyprobe::cuda
