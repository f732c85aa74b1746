// An Evaluator backed by a plugin's evaluator API.
#include "plugin/plugin_impl.hpp"

#include <nlohmann/json.hpp>

namespace polyprobe::detail {
namespace {

class PluginEvaluator final : public Evaluator {
 public:
  PluginEvaluator(const pp_plugin* plugin, const Model& model, const Loss& loss,
                  const EvaluatorOptions& options, DeviceRef device, const Subspace* subspace,
                  std::string path, std::shared_ptr<const OperationTable> operations)
      : Evaluator(subspace),
        operations_(operations ? std::make_unique<const SessionOperations>(std::move(operations),
                                                                           device.type, device.name)
                               : nullptr),
        plugin_(plugin),
        model_(model),
        loss_(loss),
        model_view_(model),
        loss_view_(loss),
        subspace_(subspace),
        subspace_view_(std::make_unique<SubspaceView>(subspace)),
        path_(std::move(path)),
        options_(options),
        device_(std::move(device)),
        threads_(options.threads) {
    if (plugin_->session_create == nullptr)
      throw Error("plugin " + std::string(plugin_->name) + " provides no evaluator session");
    create_session();
  }
  ~PluginEvaluator() override {
    if (self_ != nullptr) api_->destroy(self_);
  }
  PluginEvaluator(const PluginEvaluator&) = delete;
  PluginEvaluator& operator=(const PluginEvaluator&) = delete;

  std::string name() const override { return plugin_->name; }
  int threads() const override { return threads_; }

  void register_batch(const Batch& batch) override {
    follow_subspace();
    if (batch.inputs.cols() != model_.input_shape().numel())
      throw Error("batch inputs have " + std::to_string(batch.inputs.cols()) +
                  " features, the model expects " + std::to_string(model_.input_shape().numel()));
    loss_.check_targets(batch.targets, model_.output_shape().numel());
    const int64_t input_shape[2] = {batch.inputs.rows(), batch.inputs.cols()};
    const int64_t label_shape[1] = {static_cast<int64_t>(batch.targets.labels.size())};
    const int64_t target_shape[2] = {batch.targets.values.rows(), batch.targets.values.cols()};
    pp_batch_view view{};
    view.struct_size = sizeof(view);
    // The session copies what it keeps: the views need not outlive the call.
    view.inputs = {const_cast<double*>(batch.inputs.data()),
                   PP_DTYPE_F64,
                   PP_DEVICE_TYPE_CPU,
                   0,
                   2,
                   input_shape,
                   nullptr};
    if (batch.targets.is_classification())
      view.labels = {const_cast<int64_t*>(batch.targets.labels.data()),
                     PP_DTYPE_I64,
                     PP_DEVICE_TYPE_CPU,
                     0,
                     1,
                     label_shape,
                     nullptr};
    else
      view.targets = {const_cast<double*>(batch.targets.values.data()),
                      PP_DTYPE_F64,
                      PP_DEVICE_TYPE_CPU,
                      0,
                      2,
                      target_shape,
                      nullptr};
    check(api_->set_batch(self_, &view, &err_), "bind a batch");
    // A subspace that rotates makes a new session, which needs the batch again.
    if (subspace_ != nullptr && subspace_->can_rotate() && &batch != &batch_) batch_ = batch;
    has_batch_ = true;
  }

  // The stateless calls go through the session too: the incumbent crosses only when it
  // differs from the last one sent, the particles only when they change.
  double evaluate_base(std::span<const double> base) override {
    check_base(base);
    sync_incumbent(base);
    double loss = 0.0;
    score(CandidateSet{}, {}, &loss);
    return loss;
  }

  void evaluate(std::span<const double> base, const CandidateSet& set,
                std::span<double> losses) override {
    check_base(base);
    set.validate();
    if (!has_particles(*set.particles, bound_polytope(), bound_probes()))
      bind_particles(
          *set.particles,
          bound_polytope().cols() == set.particles->d ? bound_polytope() : Matrix<double>(),
          bound_probes());
    sync_incumbent(base);
    score(set, losses, nullptr);
  }

  bool solves_transport() const override {
    return PP_HAS_FIELD(api_, pp_session_api, transport) && api_->transport != nullptr;
  }

  bool draws_rotations(int32_t d) const override {
    return solves_transport() && PP_HAS_FIELD(api_, pp_session_api, draws_rotations) &&
           api_->draws_rotations != nullptr && api_->draws_rotations(self_, d) != 0;
  }

  void solve_transport(const TransportStepRequest& request,
                       std::span<TransportBlockResult> blocks) override {
    if (!solves_transport()) Evaluator::solve_transport(request, blocks);
    const auto n_blocks = static_cast<int64_t>(request.block_first.size());
    const auto V = static_cast<int64_t>(bound_polytope().rows());
    const int64_t P = bound_particles().count();
    if (static_cast<int64_t>(blocks.size()) != n_blocks ||
        static_cast<int64_t>(request.block_count.size()) != n_blocks)
      throw Error("solve_transport: " + std::to_string(blocks.size()) + " results and " +
                  std::to_string(request.block_count.size()) + " block sizes for " +
                  std::to_string(n_blocks) + " blocks");
    pp_transport_request r{};
    r.struct_size = sizeof(r);
    switch (request.solver) {
      case TransportSolver::sinkhorn:
        r.solver = PP_SOLVER_SINKHORN;
        break;
      case TransportSolver::softmax:
        r.solver = PP_SOLVER_SOFTMAX;
        break;
      case TransportSolver::greedy:
      case TransportSolver::top_k:
        r.solver = PP_SOLVER_TOP_K;
        break;
      case TransportSolver::automatic:
        throw Error("solve_transport: the solver must be resolved");
    }
    r.top_k = request.solver == TransportSolver::greedy ? 1 : request.top_k;
    r.sinkhorn_max_iterations = request.sinkhorn.max_iterations;
    r.sinkhorn_tolerance = request.sinkhorn.tolerance;
    r.temperature = request.temperature;
    switch (request.cost_scaling) {
      case CostScaling::none:
        r.cost_scaling = PP_COST_SCALING_NONE;
        break;
      case CostScaling::mean:
        r.cost_scaling = PP_COST_MEAN;
        break;
      case CostScaling::max_cost:
        r.cost_scaling = PP_COST_MAX;
        break;
      case CostScaling::min_max:
        r.cost_scaling = PP_COST_MIN_MAX;
        break;
    }
    r.nonfinite_margin = request.nonfinite_margin;
    r.n_blocks = n_blocks;
    r.block_first = request.block_first.data();
    r.block_count = request.block_count.data();
    r.step_radius = request.step_radius;
    // The duals cross as flat arrays (per particle and per vertex): in, then back out.
    std::vector<uint8_t> fresh;
    if (request.solver == TransportSolver::sinkhorn) {
      if (request.duals == nullptr || static_cast<int64_t>(request.duals->size()) != n_blocks)
        throw Error("solve_transport: sinkhorn needs one dual pair per block");
      duals_f_.assign(static_cast<std::size_t>(P), 0.0);
      duals_g_.assign(static_cast<std::size_t>(n_blocks * V), 0.0);
      fresh.assign(static_cast<std::size_t>(n_blocks), 0);
      for (int64_t b = 0; b < n_blocks; ++b) {
        const SinkhornDuals& dual = (*request.duals)[static_cast<std::size_t>(b)];
        const int64_t rows = request.block_count[static_cast<std::size_t>(b)];
        if (static_cast<int64_t>(dual.f.size()) != rows ||
            static_cast<int64_t>(dual.g.size()) != V) {
          fresh[static_cast<std::size_t>(b)] = 1;
          continue;
        }
        std::copy(dual.f.begin(), dual.f.end(),
                  duals_f_.begin() + request.block_first[static_cast<std::size_t>(b)]);
        std::copy(dual.g.begin(), dual.g.end(), duals_g_.begin() + b * V);
      }
      r.duals_f = duals_f_.data();
      r.duals_g = duals_g_.data();
      r.duals_fresh = fresh.data();
    }
    r.incumbents = request.incumbents.empty() ? nullptr : request.incumbents.data();
    r.n_incumbents = static_cast<int64_t>(request.incumbents.size());
    r.scaled_radius = request.scaled_radius;
    r.moves = request.moves.data();
    std::vector<pp_transport_block> out(static_cast<std::size_t>(n_blocks));
    r.blocks = out.data();
    r.weights = request.weights.empty() ? nullptr : request.weights.data();
    check(api_->transport(self_, &r, &err_), "solve the step's transport");
    for (int64_t b = 0; b < n_blocks; ++b) {
      const pp_transport_block& o = out[static_cast<std::size_t>(b)];
      blocks[static_cast<std::size_t>(b)] = {o.cost_sum,       o.finite, o.best_cost, o.iterations,
                                             o.converged != 0, o.slope,  o.curvature};
      // A block the solve did not run for (no finite cost, or a lone row: softmax) keeps
      // its duals as they were, as on the host.
      const bool solved = o.finite > 0 && request.block_count[static_cast<std::size_t>(b)] > 1;
      if (request.solver == TransportSolver::sinkhorn &&
          (solved || fresh[static_cast<std::size_t>(b)] == 0)) {
        SinkhornDuals& dual = (*request.duals)[static_cast<std::size_t>(b)];
        const int64_t first = request.block_first[static_cast<std::size_t>(b)];
        const int64_t rows = request.block_count[static_cast<std::size_t>(b)];
        dual.f.assign(duals_f_.begin() + first, duals_f_.begin() + first + rows);
        dual.g.assign(duals_g_.begin() + b * V, duals_g_.begin() + (b + 1) * V);
      }
    }
  }

  nlohmann::json explain() const override {
    nlohmann::json j = {{"evaluator", plugin_->name}};
    if (api_->explain != nullptr) {
      const char* text = api_->explain(self_);
      if (text != nullptr) j["plugin"] = nlohmann::json::parse(text, nullptr, false);
    }
    return j;
  }

 protected:
  // The session was created with the old map's view (and may cache projections on it):
  // replace it by one on the new map and send it what the old one had.
  void session_subspace_changed() override {
    api_->destroy(self_);
    self_ = nullptr;
    subspace_view_ = std::make_unique<SubspaceView>(subspace_);
    create_session();
    if (has_batch_) register_batch(batch_);
    if (particles_bound()) session_particles();
    if (!incumbent().empty()) session_incumbent();
  }

  void session_particles() override {
    const ParticleMap& p = bound_particles();
    const Matrix<double>& polytope = bound_polytope();
    pp_particle_layout layout{};
    layout.struct_size = sizeof(layout);
    layout.d = p.d;
    layout.n_particles = p.count();
    layout.coords = p.coords.data();
    layout.n_vertices = static_cast<int32_t>(polytope.rows());
    layout.n_probes = bound_probes();
    layout.polytope = polytope.size() > 0 ? polytope.data() : nullptr;
    check(api_->set_particles(self_, &layout, &err_), "bind the particles");
  }

  void session_incumbent() override {
    const std::span<const double> theta = incumbent();
    const int64_t shape[1] = {static_cast<int64_t>(theta.size())};
    const pp_tensor t{
        const_cast<double*>(theta.data()), PP_DTYPE_F64, PP_DEVICE_TYPE_CPU, 0, 1, shape, nullptr};
    check(api_->set_incumbent(self_, &t, &err_), "set the incumbent");
  }

  void session_move(std::span<const double> moves) override {
    // Through a subspace every coordinate's move touches a whole rank-one direction of a
    // weight: the mirror, already moved (usually a copy of the optimizer's moved parameters),
    // goes over instead of the session repeating that arithmetic.
    if (subspace_ != nullptr) {
      session_incumbent();
      return;
    }
    check(api_->move_incumbent(self_, moves.data(), &err_), "move the incumbent");
  }

  void session_score(const PolytopeProbe& probe, std::span<double> losses,
                     double* incumbent_loss) override {
    static_assert(sizeof(char) == sizeof(uint8_t));
    pp_score_request r{};
    r.struct_size = sizeof(r);
    r.form = PP_CANDIDATES_POLYTOPE;
    r.directions = probe.directions.data();
    r.probe_radius = probe.probe_radius;
    r.active =
        probe.active.empty() ? nullptr : reinterpret_cast<const uint8_t*>(probe.active.data());
    r.rotations = probe.rotations.empty() ? nullptr : probe.rotations.data();
    if (probe.stream != nullptr) {
      r.directions = nullptr;
      r.rotations_from_stream = 1;
      r.rotation_seed = probe.stream->seed;
      r.rotation_step = probe.stream->step;
    }
    // An empty span asks the session to keep the losses for solve_transport().
    check(api_->score(self_, &r, losses.empty() ? nullptr : losses.data(), incumbent_loss, &err_),
          "score a step");
  }

  void session_score(const CandidateSet& set, std::span<double> losses,
                     double* incumbent_loss) override {
    pp_score_request r{};
    r.struct_size = sizeof(r);
    r.form = PP_CANDIDATES_EXPLICIT;
    r.count = set.size();
    r.particle = set.particle.data();
    r.displacement = set.displacement.data();
    check(api_->score(self_, &r, losses.data(), incumbent_loss, &err_), "score candidates");
  }

  std::vector<double> session_read() override {
    std::vector<double> theta(static_cast<std::size_t>(model_.num_parameters()));
    const int64_t shape[1] = {static_cast<int64_t>(theta.size())};
    pp_tensor t{theta.data(), PP_DTYPE_F64, PP_DEVICE_TYPE_CPU, 0, 1, shape, nullptr};
    check(api_->read_incumbent(self_, &t, &err_), "read the incumbent");
    return theta;
  }

 private:
  void create_session() {
    if (subspace_ != nullptr && subspace_view_->get() == nullptr)
      throw Error("plugin " + std::string(plugin_->name) + ": " + subspace_view_->reason());
    const pp_session_options opts = to_pp_options(options_, device_, subspace_view_->get(),
                                                  path_.empty() ? nullptr : path_.c_str(),
                                                  operations_ ? operations_->host_api() : nullptr);
    pp_error err{};
    void* self = nullptr;
    const pp_session_api* api = nullptr;
    if (plugin_->session_create(model_view_.get(), &loss_view_.view, &opts, &self, &api, &err) !=
            PP_OK ||
        self == nullptr || api == nullptr)
      throw Error("plugin " + std::string(plugin_->name) +
                  ": cannot create an evaluator session: " + error_text(err));
    self_ = self;
    api_ = api;
  }

  void check_base(std::span<const double> base) const {
    if (static_cast<int64_t>(base.size()) != model_.num_parameters())
      throw Error("base parameter vector has " + std::to_string(base.size()) +
                  " entries, the model has " + std::to_string(model_.num_parameters()));
  }
  void check(int status, const char* what) {
    if (status != PP_OK)
      throw Error("plugin " + std::string(plugin_->name) + " failed to " + what + ": " +
                  error_text(err_));
  }

  // Keeps the operations the session was handed (opts.host) alive as long as the session.
  std::unique_ptr<const SessionOperations> operations_;
  const pp_plugin* plugin_;
  const Model& model_;
  const Loss& loss_;
  ModelView model_view_;
  LossView loss_view_;
  const Subspace* subspace_;
  std::unique_ptr<SubspaceView> subspace_view_;  // the view the session was created with
  std::string path_;
  EvaluatorOptions options_;
  DeviceRef device_;
  int threads_ = 1;
  Batch batch_;  // the last batch, kept when the subspace can rotate (a new session needs it)
  bool has_batch_ = false;
  void* self_ = nullptr;
  const pp_session_api* api_ = nullptr;
  pp_error err_{};
  std::vector<double> duals_f_, duals_g_;  // solve_transport's flat Sinkhorn duals
};

}  // namespace

pp_session_options to_pp_options(const EvaluatorOptions& options, const DeviceRef& device,
                                 const pp_subspace_view* subspace, const char* path,
                                 const pp_host_api* host) {
  pp_session_options o{};
  o.struct_size = sizeof(o);
  o.dtype = to_pp_dtype(options.dtype);
  o.device = device.type;
  o.device_name = device.name.c_str();
  o.threads = options.threads;
  o.chunk_size = options.chunk_size;
  o.subspace = subspace;
  o.path = path;
  o.host = host;
  if (options.candidate_dtype == CandidateDType::bf16) o.candidate_dtype = PP_DTYPE_BF16;
  if (options.candidate_dtype == CandidateDType::fp16) o.candidate_dtype = PP_DTYPE_F16;
  return o;
}

std::unique_ptr<Evaluator> make_plugin_evaluator(const pp_plugin* plugin, const Model& model,
                                                 const Loss& loss, const EvaluatorOptions& options,
                                                 const DeviceRef& device, const Subspace* subspace,
                                                 const std::string& path,
                                                 std::shared_ptr<const OperationTable> operations) {
  return std::make_unique<PluginEvaluator>(plugin, model, loss, options, device, subspace, path,
                                           std::move(operations));
}

}  // namespace polyprobe::detail
