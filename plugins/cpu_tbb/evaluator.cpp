// The cpu_tbb evaluator's orchestration (evaluator_impl.hpp): chunks, threads, one call,
// explain.
#include "evaluator_impl.hpp"

#include <polyprobe/plugin/plugin.hpp>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <stdexcept>
#include <unordered_map>

namespace polyprobe::cpu_tbb {
namespace {

// Working memory one worker may hold for its block of candidates when chunk_size is
// automatic. Fixed (not divided by the thread count) so that blocks, and with them every
// loss bit, are the same for any number of threads.
constexpr double kWorkerBudgetBytes = 64.0 * 1024 * 1024;
// Per-thread parameter copies beyond this use the in-place path instead of dense.
constexpr double kParamCopiesBudgetBytes = 4.0 * 1024 * 1024 * 1024;

bool is(const char* a, const char* b) { return a != nullptr && std::strcmp(a, b) == 0; }

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// The forced path, checked before anything is built: "" = auto.
std::string forced_path(const pp_session_options& options) {
  // NOLINTNEXTLINE(bugprone-sizeof-expression): the field is a pointer; its size is the check
  if (!PP_HAS_FIELD(&options, pp_session_options, path) || options.path == nullptr ||
      is(options.path, "auto"))
    return {};
  std::string forced = options.path;
  const bool known = forced == "sparse" || forced == "subspace-delta" || forced == "dense" ||
                     forced == "inplace" || forced == "fallback" || forced == "site-local";
  if (!known)
    throw std::invalid_argument("unknown path '" + forced + "' (paths: " + kPathNames + ")");
  return forced;
}

}  // namespace

template <class S>
EvaluatorImpl<S>::EvaluatorImpl(const pp_model_view& model, const pp_loss_view& loss,
                                const pp_session_options& options)
    : ctx_(model, loss, options),
      planner_(ctx_.plan, ctx_.coordinate_index(), forced_path(options),
               ctx_.loss == kernels::LossKind::zero_one),
      delta_(ctx_),
      materialised_(ctx_),
      site_local_(ctx_) {
  ctx_.planner = &planner_;
  chunk_ = options.chunk_size;
  chunk_auto_ = chunk_ <= 0;
  const double copies = static_cast<double>(ctx_.arena->max_concurrency()) *
                        static_cast<double>(ctx_.plan.n_params) * sizeof(S);
  inplace_for_dense_ = copies > kParamCopiesBudgetBytes;
}

template <class S>
void EvaluatorImpl<S>::register_batch(const pp_batch_view& batch) {
  ctx_.inc.set_batch(batch, ctx_.plan.in_features);
  if (chunk_auto_) chunk_ = auto_chunk();
}

template <class S>
int64_t EvaluatorImpl<S>::auto_chunk() const {
  // Per candidate in flight: a few feature-major buffers of the widest layer.
  const double per_candidate = 4.0 * static_cast<double>(std::max<int64_t>(ctx_.inc.batch, 1)) *
                               static_cast<double>(ctx_.plan.max_width()) * sizeof(S);
  return std::max<int64_t>(1, static_cast<int64_t>(kWorkerBudgetBytes / per_candidate));
}

template <class S>
double EvaluatorImpl<S>::memory_estimate_bytes() const {
  double widths = static_cast<double>(ctx_.plan.in_features), weights = 0;
  for (std::size_t l = 0; l < ctx_.plan.layers.size(); ++l) {
    const LayerPlan& layer = ctx_.plan.layers[l];
    widths += static_cast<double>(layer.out);
    if (layer.op == LayerOp::affine) weights += static_cast<double>(layer.weight_count);
  }
  const double n = static_cast<double>(ctx_.plan.n_params), b = static_cast<double>(ctx_.inc.batch);
  const double workers = ctx_.arena->max_concurrency();
  const double params = 8.0 * n + sizeof(S) * (n + weights);                 // base, effective, W^T
  const double copies = inplace_for_dense_ ? 0.0 : workers * sizeof(S) * n;  // dense/fallback
  const double activations = 2.0 * sizeof(S) * b * widths;                   // both layouts
  const double in_flight = workers * 4.0 * sizeof(S) * b *
                           static_cast<double>(ctx_.plan.max_width()) * static_cast<double>(chunk_);
  return params + copies + activations + in_flight + delta_.table_bytes();
}

template <class S>
void EvaluatorImpl<S>::plan_tasks() {
  constexpr int64_t kCandidatesPerTask = 128;
  // A delta group whose particle changes several units (or directions) of its first layer
  // takes the sparse route through every later layer, without the rank-one shortcut: on
  // mlp256-full its candidates (the first layer's biases) cost 12-30 times the others', and
  // three tasks of them were the longest of the 16-thread phase (2.6 ms of 6.4). They count
  // that much more toward a task. Tasks never change a loss: each candidate's is its own.
  constexpr int64_t kSeveralUnitsWeight = 16;
  const std::vector<Term>& terms = planner_.terms();
  const auto weight = [&](const Group& g) -> int64_t {
    if (g.path != Path::delta || g.terms_end - g.terms_begin < 2) return 1;
    const Term& first = terms[static_cast<std::size_t>(g.terms_begin)];
    for (int64_t t = g.terms_begin + 1; t < g.terms_end; ++t) {
      const Term& other = terms[static_cast<std::size_t>(t)];
      if (other.layer != first.layer) break;
      if (other.row != first.row || (first.row < 0 && other.u_index != first.u_index))
        return kSeveralUnitsWeight;
    }
    return 1;
  };
  tasks_.clear();
  const std::vector<Group>& all = planner_.groups();
  const std::vector<std::size_t>& selected = planner_.selected();
  std::size_t begin = 0;
  int64_t run = 0;  // weighted candidates in the current run of cheap groups
  for (std::size_t i = 0; i < selected.size(); ++i) {
    const Group& g = all[selected[i]];
    const bool cheap =
        g.path == Path::delta || g.path == Path::incumbent || g.path == Path::inplace;
    if (cheap) {
      run += (g.end - g.begin) * weight(g);
      if (run < kCandidatesPerTask) continue;
      tasks_.emplace_back(begin, i + 1);
    } else {
      if (begin < i) tasks_.emplace_back(begin, i);  // the cheap run before it
      tasks_.emplace_back(i, i + 1);
    }
    begin = i + 1;
    run = 0;
  }
  if (begin < selected.size()) tasks_.emplace_back(begin, selected.size());
}

template <class S>
void EvaluatorImpl<S>::run_groups(const Candidates& c, double* losses) {
  for (TaskTimes& t : task_ms_) t = TaskTimes{};
  ctx_.arena->execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, tasks_.size(), 1),
        [&](const tbb::blocked_range<std::size_t>& range) {
          for (std::size_t t = range.begin(); t != range.end(); ++t) {
            const auto start = Clock::now();
            // A host layer's forward may run its own parallel loop (self_attention's sdpa
            // operation does). While this thread waits for that loop, TBB may hand it any
            // task of this arena, among them another of these tasks, which would take the
            // same Scratch mid-group (its touched parameters, coefficients, stacked rows and
            // parameter copy). Isolated, the wait runs only the inner loop's own tasks.
            tbb::this_task_arena::isolate([&] {
              Scratch& s = scratch_.local();
              for (std::size_t i = tasks_[t].first; i != tasks_[t].second; ++i) {
                const Group& g = planner_.groups()[planner_.selected()[i]];
                if (g.path != Path::inplace) evaluate_group(c, g, s, losses);
              }
              delta_.finish_task(s, losses);
            });
            TaskTimes& times = task_ms_.local();
            const double ms = ms_since(start);
            times.busy += ms;
            times.longest = std::max(times.longest, ms);
          }
        },
        tbb::simple_partitioner());
  });
  for (const TaskTimes& t : task_ms_) {
    last_ms_.busy += t.busy;
    last_ms_.longest_task = std::max(last_ms_.longest_task, t.longest);
  }
  // In-place groups share one parameter copy: one at a time, parallel inside.
  const auto inplace_start = Clock::now();
  Scratch& s = scratch_.local();
  for (const std::size_t i : planner_.selected())
    if (planner_.groups()[i].path == Path::inplace)
      materialised_.evaluate_inplace(c, planner_.groups()[i], s, losses);
  last_ms_.inplace = ms_since(inplace_start);
}

template <class S>
void EvaluatorImpl<S>::evaluate_group(const Candidates& c, const Group& g, Scratch& s,
                                      double* losses) const {
  switch (g.path) {
    case Path::delta:
      delta_.evaluate(c, g, s, losses);
      return;
    case Path::dense:
      materialised_.evaluate_dense(c, g, s, losses);
      return;
    case Path::fallback:
      materialised_.evaluate_fallback(c, g, s, losses);
      return;
    case Path::site_local:
      site_local_.evaluate(c, g, s, losses);
      return;
    case Path::incumbent:
      std::fill(losses + g.begin, losses + g.end, ctx_.inc.base_loss);
      return;
    case Path::inplace:
    case Path::count:
      break;
  }
}

template <class S>
void EvaluatorImpl<S>::evaluate(const Candidates& c, double* losses, double* incumbent_loss,
                                uint64_t incumbent_version) {
  if (ctx_.inc.batch == 0) throw std::logic_error("score before set_batch");
  if (c.n_params != ctx_.plan.n_params)
    throw std::invalid_argument("base parameter vector has " + std::to_string(c.n_params) +
                                " entries, the model has " + std::to_string(ctx_.plan.n_params));
  last_ms_ = PhaseTimes{};
  auto start = Clock::now();
  if (ctx_.inc.stale(incumbent_version))
    ctx_.arena->execute([&] {
      ctx_.inc.refresh(ctx_.plan, c.base_params, incumbent_version, ctx_.loss, ctx_.l2,
                       *ctx_.projections);
    });
  last_ms_.incumbent = ms_since(start);
  if (incumbent_loss != nullptr) *incumbent_loss = ctx_.inc.base_loss;
  if (c.count == 0) return;
  for (;;) {
    try {
      start = Clock::now();
      const bool planned = c.structure_key != 0 && c.structure_key == planned_key_ &&
                           chunk_ == planned_chunk_ && inplace_for_dense_ == planned_inplace_;
      // The same mask as the last call's (or both none): its selection and tasks stand.
      const bool same_selection =
          planned && (c.active == nullptr
                          ? !selected_by_mask_
                          : selected_by_mask_ &&
                                std::equal(selected_mask_.begin(), selected_mask_.end(), c.active));
      if (!planned) {
        planned_key_ = 0;  // until this plan is complete
        planner_.plan(c, chunk_, inplace_for_dense_, [this](const Group& g, bool other_forced) {
          return site_local_.decline(g, other_forced);
        });
        planned_key_ = c.structure_key;
        planned_chunk_ = chunk_;
        planned_inplace_ = inplace_for_dense_;
      }
      if (!same_selection) {
        selected_by_mask_ = false;  // until this selection is complete
        planner_.select(c.active);
        plan_tasks();
        selected_by_mask_ = c.active != nullptr;
        if (selected_by_mask_) selected_mask_.assign(c.active, c.active + c.n_particles);
      }
      site_local_.prepare();
      // The feature-major activations the delta path reads: from its first layer on, and at
      // the subspace's dense directions (direction tables).
      std::size_t first = ctx_.plan.layers.size();
      const std::vector<int64_t>& delta_first = planner_.first_layer_candidates();
      for (std::size_t l = 0; l < delta_first.size() && l < first; ++l)
        if (delta_first[l] > 0) first = l;
      for (const int32_t l : ctx_.dense_u_layer)
        first = std::min(first, static_cast<std::size_t>(l));
      if (first < ctx_.inc.transposed_from)
        ctx_.arena->execute([&] { ctx_.inc.transpose_from(first); });
      last_ms_.plan = ms_since(start);
      start = Clock::now();
      delta_.build_tables();
      last_ms_.tables = ms_since(start);
      start = Clock::now();
      run_groups(c, losses);
      last_ms_.groups = ms_since(start) - last_ms_.inplace;
      return;
    } catch (const std::bad_alloc&) {
      // Too much held at once: halve the chunk and run the whole set again.
      if (chunk_ <= 1) throw;
      chunk_ = std::max<int64_t>(1, chunk_ / 2);
      ++chunk_halvings_;
      planned_key_ = 0;
      scratch_.clear();
      delta_.drop_tables();
    }
  }
}

template <class S>
const char* EvaluatorImpl<S>::explain() {
  using nlohmann::json;
  json layers = json::array();
  for (std::size_t l = 0; l < ctx_.plan.layers.size(); ++l) {
    const LayerPlan& layer = ctx_.plan.layers[l];
    json paths = json::object(), declined = json::array();
    for (int p = 0; p < kPathCount; ++p)
      if (planner_.layer_path_candidates()[l][static_cast<std::size_t>(p)] > 0)
        paths[path_name(static_cast<Path>(p), ctx_.subspace_mode)] =
            planner_.layer_path_candidates()[l][static_cast<std::size_t>(p)];
    for (int w = 1; w < static_cast<int>(Decline::count); ++w)
      if (planner_.layer_declines()[l][static_cast<std::size_t>(w)] > 0)
        declined.push_back(
            {{"why", decline_text(static_cast<Decline>(w))},
             {"candidates", planner_.layer_declines()[l][static_cast<std::size_t>(w)]}});
    json entry = {
        {"layer", l},
        {"kind", layer.view->kind},
        {"runs_as",
         layer.op == LayerOp::elementwise && layer.is_relu ? "relu (native)" : op_name(layer.op)},
        {"parameters", layer.count},
        {"candidates_starting_here", paths},
        {"declined", declined},
        {"kink_tables", delta_.kink_table_built(l)}};
    if (!layer.probe_note.empty()) entry["contract_not_trusted"] = layer.probe_note;
    if (site_local_.layer(l).declared)
      entry["site_local"] = site_local_.layer(l).usable()
                                ? "yes (probed)" + site_local_.layer(l).detail
                                : site_local_.layer(l).note;
    layers.push_back(entry);
  }
  json counts = json::object();
  for (int p = 0; p < kPathCount; ++p)
    counts[path_name(static_cast<Path>(p), ctx_.subspace_mode)] =
        planner_.path_candidates()[static_cast<std::size_t>(p)];
  json j = {{"plugin", "cpu_tbb"},
            {"dtype", std::is_same_v<S, float> ? "float32" : "float64"},
            {"threads", ctx_.arena->max_concurrency()},
            {"space",
             ctx_.subspace_mode ? std::string("subspace (") + ctx_.subspace->kind + ")" : "full"},
            {"forced_path", planner_.forced().empty() ? "auto" : planner_.forced()},
            {"chunk_size", chunk_},
            {"chunk_size_automatic", chunk_auto_},
            {"chunk_halvings", chunk_halvings_},
            {"memory_estimate_bytes", memory_estimate_bytes()},
            {"dense_uses_inplace", inplace_for_dense_},
            {"subspace_projections", ctx_.projections->describe()},
            {"prefix_reuse", ctx_.plan.no_prefix_reuse.empty() ? "yes" : ctx_.plan.no_prefix_reuse},
            {"last_call_candidates_per_path", counts},
            {"last_call_ms",
             {{"incumbent", last_ms_.incumbent},
              {"plan", last_ms_.plan},
              {"tables", last_ms_.tables},
              {"groups", last_ms_.groups},
              {"inplace", last_ms_.inplace},
              {"groups_busy", last_ms_.busy},
              {"longest_task", last_ms_.longest_task},
              {"note",
               "wall ms of the last call: the incumbent's forward when it changed; planning the "
               "groups and preparing site-local work; the delta tables; the groups on the "
               "threads (groups_busy: the workers' time in them, summed; longest_task: the "
               "slowest run of groups one worker took at once); in-place groups one at a time"}}},
            {"layers", layers},
            {"paths",
             {{"sparse",
               "full space: the particle's change propagates as a delta, sparse through "
               "elementwise layers, dense one affine layer later"},
              {"subspace-delta", "rank-one subspace coordinates propagate as deltas"},
              {"dense",
               "the changed layers' weights materialised per candidate, later layers one "
               "GEMM over the particle's candidates"},
              {"inplace", "apply, score, revert on one shared parameter copy"},
              {"fallback", "the whole forward of each materialised candidate"},
              {"site-local",
               "a particle in one conv or attention layer: only the output channels or heads "
               "it owns recomputed per candidate, the suffix one pass over the group"}}}};
  explain_ = j.dump();
  return explain_.c_str();
}

template class EvaluatorImpl<float>;
template class EvaluatorImpl<double>;

std::string unsupported_reason(const pp_model_view& model, const pp_loss_view& loss,
                               const pp_session_options& options) {
  if (options.device != PP_DEVICE_TYPE_CPU) return "it runs on the cpu only";
  if (options.dtype != PP_DTYPE_F32 && options.dtype != PP_DTYPE_F64)
    return std::string("it computes in float32 or float64, not ") + pp::dtype_name(options.dtype);
  if (kernels::loss_kind(loss.name) == kernels::LossKind::unknown)
    return std::string("unknown loss '") + (loss.name ? loss.name : "") + "'";
  for (int32_t i = 0; i < model.n_layers; ++i)
    if (model.layers[i].host_forward == nullptr)
      return "layer " + std::to_string(i) + " (" + model.layers[i].kind + ") has no host forward";
  // NOLINTNEXTLINE(bugprone-sizeof-expression): the field is a pointer; its size is the check
  if (PP_HAS_FIELD(&options, pp_session_options, subspace) && options.subspace != nullptr &&
      options.subspace->n_params != model.n_params)
    return "the subspace maps into " + std::to_string(options.subspace->n_params) +
           " parameters, the model has " + std::to_string(model.n_params);
  return {};
}

std::unique_ptr<CandidateEvaluator> make_candidate_evaluator(const pp_model_view& model,
                                                             const pp_loss_view& loss,
                                                             const pp_session_options& options) {
  if (const std::string why = unsupported_reason(model, loss, options); !why.empty())
    throw std::invalid_argument(why);
  if (options.dtype == PP_DTYPE_F32)
    return std::make_unique<EvaluatorImpl<float>>(model, loss, options);
  return std::make_unique<EvaluatorImpl<double>>(model, loss, options);
}

}  // namespace polyprobe::cpu_tbb
