// Transport solvers.
#include "transport_threads.hpp"
#include "vector_math.hpp"

#include <polyprobe/error.hpp>
#include <polyprobe/transport.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

namespace polyprobe {

TransportSolver parse_transport_solver(std::string_view name) {
  if (name == "auto" || name == "automatic") return TransportSolver::automatic;
  if (name == "sinkhorn") return TransportSolver::sinkhorn;
  if (name == "softmax") return TransportSolver::softmax;
  if (name == "greedy" || name == "min_cost_greedy") return TransportSolver::greedy;
  if (name == "top_k" || name == "top_k_mean") return TransportSolver::top_k;
  throw Error("unknown transport solver '" + std::string(name) +
              "' (use auto, sinkhorn, softmax, greedy or top_k)");
}

std::string_view to_string(TransportSolver solver) {
  switch (solver) {
    case TransportSolver::automatic:
      return "auto";
    case TransportSolver::sinkhorn:
      return "sinkhorn";
    case TransportSolver::softmax:
      return "softmax";
    case TransportSolver::greedy:
      return "greedy";
    case TransportSolver::top_k:
      return "top_k";
  }
  return "?";
}

CostScaling parse_cost_scaling(std::string_view name) {
  if (name == "none") return CostScaling::none;
  if (name == "mean") return CostScaling::mean;
  if (name == "max_cost") return CostScaling::max_cost;
  if (name == "min_max") return CostScaling::min_max;
  throw Error("unknown cost scaling '" + std::string(name) +
              "' (use none, mean, max_cost or min_max)");
}

std::string_view to_string(CostScaling scaling) {
  switch (scaling) {
    case CostScaling::none:
      return "none";
    case CostScaling::mean:
      return "mean";
    case CostScaling::max_cost:
      return "max_cost";
    case CostScaling::min_max:
      return "min_max";
  }
  return "?";
}

void scale_cost(CostScaling scaling, MatrixRef<double> cost) {
  if (cost.size() == 0) return;
  switch (scaling) {
    case CostScaling::none:
      return;
    case CostScaling::mean: {
      const double m = cost.cwiseAbs().mean();
      if (m > 0) cost /= m;
      return;
    }
    case CostScaling::max_cost: {
      const double m = cost.cwiseAbs().maxCoeff();
      if (m > 0) cost /= m;
      return;
    }
    case CostScaling::min_max: {
      const double lo = cost.minCoeff();
      const double range = cost.maxCoeff() - lo;
      cost.array() -= lo;
      if (range > 0) cost /= range;
      return;
    }
  }
}

namespace {

using detail::RowChunks;

// Per fixed chunk of rows (RowChunks), what a column update needs of its rows for the row
// duals f: the column maxima m_v = max_i (f_i - C_iv) and the sums s_v = sum_i exp((f_i - C_iv -
// m_v) / eps) in row order, [2 V] doubles a chunk (maxima, then sums). Each chunk's own maximum
// keeps its sums in range, so maxima and sums cross between processes in one exchange; the
// column update combines them in chunk order (the bits depend on neither the thread nor the
// process count).
struct ColumnPartials {
  std::vector<double> values;  // [chunks 2V]
  std::size_t cols = 0;
  void resize(int64_t chunks, std::size_t v) {
    cols = v;
    values.resize(2 * cols * static_cast<std::size_t>(chunks));
  }
  double* of(int64_t chunk) { return values.data() + 2 * cols * static_cast<std::size_t>(chunk); }
};

// The column partials of the rows [begin, end) into `out` ([2 V]: maxima, then sums).
void column_partials(const ConstMatrixRef<double>& cost, const std::vector<double>& f, double eps,
                     Eigen::Index begin, Eigen::Index end, double* out) {
  const auto cols = static_cast<std::size_t>(cost.cols());
  double* column_max = out;
  double* sums = out + cols;
  std::fill(column_max, column_max + cols, -std::numeric_limits<double>::infinity());
  for (Eigen::Index i = begin; i < end; ++i)
    for (std::size_t v = 0; v < cols; ++v)
      column_max[v] = std::max(
          column_max[v], f[static_cast<std::size_t>(i)] - cost(i, static_cast<Eigen::Index>(v)));
  // The chunk's exponents, then their exponentials in one vector pass, then the sums in row
  // order. The buffer is the thread's (a chunk's rows, kept between calls).
  thread_local std::vector<double> exponents;
  exponents.resize(static_cast<std::size_t>(end - begin) * cols);
  double* e = exponents.data();
  for (Eigen::Index i = begin; i < end; ++i)
    for (std::size_t v = 0; v < cols; ++v)
      e[static_cast<std::size_t>(i - begin) * cols + v] =
          (f[static_cast<std::size_t>(i)] - cost(i, static_cast<Eigen::Index>(v)) - column_max[v]) /
          eps;
  const auto count = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(end - begin) * cols);
  detail::exp_in_place(e, count);
  std::fill(sums, sums + cols, 0.0);
  for (const double* row = e; row < e + count; row += cols)
    for (std::size_t v = 0; v < cols; ++v) sums[v] += row[v];
}

// g_v <- -eps log sum_i a exp((f_i - C_iv) / eps), a = 1/P: makes the column sums 1/V.
// The own chunks' partials are already in `partial` (ready: the row update left them) or
// computed first. Over all chunks, M_v = max_c m_cv and the sum is sum_c s_cv exp((m_cv - M_v)
// / eps) in chunk order.
void update_column_duals(const ConstMatrixRef<double>& cost, double eps,
                         const std::vector<double>& f, std::vector<double>& g,
                         ColumnPartials& partial, bool ready, const RowChunks& chunks,
                         const detail::StepThreads& threads) {
  const auto rows = cost.rows();
  const auto cols = static_cast<std::size_t>(cost.cols());
  if (!ready)
    chunks.for_own(threads, [&](int64_t chunk, int64_t begin, int64_t end) {
      column_partials(cost, f, eps, begin, end, partial.of(chunk));
    });
  chunks.share_chunks(partial.values, static_cast<int64_t>(2 * cols), "Sinkhorn's column partials");
  std::vector<double> column_max(cols, -std::numeric_limits<double>::infinity());
  for (int64_t c = 0; c < chunks.count(); ++c)
    for (std::size_t v = 0; v < cols; ++v)
      column_max[v] = std::max(column_max[v], partial.of(c)[v]);
  // Each chunk's factor exp((m_cv - M_v) / eps), in one vector pass.
  thread_local std::vector<double> factors;
  factors.resize(static_cast<std::size_t>(chunks.count()) * cols);
  for (int64_t c = 0; c < chunks.count(); ++c)
    for (std::size_t v = 0; v < cols; ++v)
      factors[static_cast<std::size_t>(c) * cols + v] = (partial.of(c)[v] - column_max[v]) / eps;
  detail::exp_in_place(factors.data(), static_cast<std::ptrdiff_t>(factors.size()));
  const double log_rows = std::log(static_cast<double>(rows));
  for (std::size_t v = 0; v < cols; ++v) {
    double sum = 0;
    for (int64_t c = 0; c < chunks.count(); ++c)
      sum += partial.of(c)[cols + v] * factors[static_cast<std::size_t>(c) * cols + v];
    g[v] = -(column_max[v] + eps * (std::log(sum) - log_rows));
  }
}

// Rows [begin, end) of the row-normalised plan for the column duals g: W_iv = exp((g_v - C_iv
// - m) / eps) / s, with m the row's maximum of g_v - C_iv and s the sum of the exponentials
// (returned with m in rows[i - begin] when rows is not null: the row dual is -(m + eps (log
// s - log V))). The one formula of both the row update and the final plan, so the plan a row
// update leaves is the bits of a separate pass. The exponentials of a whole chunk are taken
// in one vector pass (vector_math.hpp), in place in the plan when its rows are contiguous.
struct RowPlan {
  double max = 0, sum = 0;
};
void plan_rows(const ConstMatrixRef<double>& cost, const std::vector<double>& g, double eps,
               Eigen::Index begin, Eigen::Index end, MatrixRef<double>& weights, RowPlan* rows) {
  const Eigen::Index cols = cost.cols();
  const bool contiguous = weights.outerStride() == cols;
  for (Eigen::Index i = begin; i < end; ++i) {
    double m = -std::numeric_limits<double>::infinity();
    for (Eigen::Index v = 0; v < cols; ++v)
      m = std::max(m, g[static_cast<std::size_t>(v)] - cost(i, v));
    for (Eigen::Index v = 0; v < cols; ++v)
      weights(i, v) = (g[static_cast<std::size_t>(v)] - cost(i, v) - m) / eps;
    if (rows != nullptr) rows[i - begin].max = m;
    if (!contiguous) detail::exp_in_place(&weights(i, 0), cols);
  }
  if (contiguous && end > begin) detail::exp_in_place(&weights(begin, 0), (end - begin) * cols);
  for (Eigen::Index i = begin; i < end; ++i) {
    double sum = 0.0;
    for (Eigen::Index v = 0; v < cols; ++v) sum += weights(i, v);
    weights.row(i) /= sum;
    if (rows != nullptr) rows[i - begin].sum = sum;
  }
}

// f_i <- -eps log sum_v b exp((g_v - C_iv) / eps), b = 1/V: makes the row sums 1/P. The same
// pass leaves what the next steps would otherwise read the whole cost again for: each own
// chunk's column partials with the new f (all the next column update computes before its
// exchange), and the row-normalised plan for this g (solve_sinkhorn's result if g does not
// change again), both the bits a separate pass would compute.
void update_row_duals(const ConstMatrixRef<double>& cost, double eps, const std::vector<double>& g,
                      std::vector<double>& f, ColumnPartials& partial, MatrixRef<double> weights,
                      const RowChunks& chunks, const detail::StepThreads& threads) {
  const auto cols = cost.cols();
  const double log_cols = std::log(static_cast<double>(cols));
  chunks.for_own(threads, [&](int64_t chunk, int64_t begin, int64_t end) {
    RowPlan rows[StepShard::kGrain];
    plan_rows(cost, g, eps, begin, end, weights, rows);
    for (Eigen::Index i = begin; i < end; ++i) {
      const RowPlan& r = rows[i - begin];
      f[static_cast<std::size_t>(i)] = -(r.max + eps * (std::log(r.sum) - log_cols));
    }
    column_partials(cost, f, eps, begin, end, partial.of(chunk));
  });
}

void check_sizes(const ConstMatrixRef<double>& cost, const MatrixRef<double>& weights) {
  if (weights.rows() != cost.rows() || weights.cols() != cost.cols())
    throw Error("transport: weights are " + std::to_string(weights.rows()) + " x " +
                std::to_string(weights.cols()) + " but the cost is " + std::to_string(cost.rows()) +
                " x " + std::to_string(cost.cols()));
}

const detail::StepThreads& serial() {
  static const detail::StepThreads one(1);
  return one;
}

// Every row of a problem of its own (the public serial forms).
RowChunks whole(const ConstMatrixRef<double>& cost) { return RowChunks(0, cost.rows(), nullptr); }

}  // namespace

namespace detail {

TransportResult solve_sinkhorn(const ConstMatrixRef<double>& cost, double epsilon,
                               const SinkhornSettings& settings, SinkhornDuals& duals,
                               MatrixRef<double> weights, const RowChunks& chunks,
                               const StepThreads& threads) {
  check_sizes(cost, weights);
  const auto rows = static_cast<std::size_t>(cost.rows());
  const auto cols = static_cast<std::size_t>(cost.cols());
  if (!(epsilon > 0))
    throw Error("sinkhorn: epsilon must be positive, got " + std::to_string(epsilon));
  // Each row update writes the plan while later passes still read the cost.
  if (weights.data() == cost.data() && cost.size() > 0)
    throw Error("sinkhorn: the weights must not share the cost's memory (pass another matrix)");
  ColumnPartials partial;
  partial.resize(chunks.count(), cols);
  // After a row update, the plan for the current g and the next column partials are known.
  bool fresh = false;
  if (duals.f.size() != rows || duals.g.size() != cols) {
    duals.f.assign(rows, 0.0);
    duals.g.assign(cols, 0.0);
    update_row_duals(cost, epsilon, duals.g, duals.f, partial, weights, chunks, threads);
    fresh = true;
  }
  TransportResult result;
  result.converged = false;
  std::vector<double> next_g(cols);
  for (int32_t it = 0; it < settings.max_iterations; ++it) {
    // With rows exact, the column sums times V are exp((g_v - g_v') / eps), where g' is the
    // update: the error check costs nothing extra.
    update_column_duals(cost, epsilon, duals.f, next_g, partial, fresh, chunks, threads);
    double error = 0;
    for (std::size_t v = 0; v < cols; ++v)
      error = std::max(error, std::abs(std::expm1((duals.g[v] - next_g[v]) / epsilon)));
    result.marginal_error = error;
    result.iterations = it;
    if (error <= settings.tolerance) {
      result.converged = true;
      break;
    }
    duals.g = next_g;
    update_row_duals(cost, epsilon, duals.g, duals.f, partial, weights, chunks, threads);
    fresh = true;
    result.iterations = it + 1;
  }
  if (fresh) return result;  // the last row update left the plan for this g
  // Row-normalised plan: W_iv = exp((f_i + g_v - C_iv) / eps) / V, renormalised exactly.
  chunks.for_own(threads, [&](int64_t, int64_t begin, int64_t end) {
    plan_rows(cost, duals.g, epsilon, begin, end, weights, nullptr);
  });
  return result;
}

void solve_softmax(const ConstMatrixRef<double>& cost, double epsilon, MatrixRef<double> weights,
                   const RowChunks& chunks, const StepThreads& threads) {
  check_sizes(cost, weights);
  // The plan of Sinkhorn's first row update from g = 0 (the same formula: exp(-(C_iv - min_v
  // C_iv) / eps) normalised by row).
  const std::vector<double> zero(static_cast<std::size_t>(cost.cols()), 0.0);
  chunks.for_own(threads, [&](int64_t, int64_t begin, int64_t end) {
    plan_rows(cost, zero, epsilon, begin, end, weights, nullptr);
  });
}

void solve_top_k(const ConstMatrixRef<double>& cost, int32_t k, MatrixRef<double> weights,
                 const RowChunks& chunks, const StepThreads& threads) {
  check_sizes(cost, weights);
  const auto cols = static_cast<std::size_t>(cost.cols());
  if (k < 1 || static_cast<std::size_t>(k) > cols)
    throw Error("top_k: k = " + std::to_string(k) + " must be in [1, " + std::to_string(cols) +
                "]");
  chunks.for_own(threads, [&](int64_t, int64_t begin, int64_t end) {
    std::vector<int64_t> order(cols);
    for (Eigen::Index i = begin; i < end; ++i) {
      weights.row(i).setZero();
      std::iota(order.begin(), order.end(), 0);
      // Stable: ties go to the earlier vertex, so the rule is deterministic.
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return cost(i, a) < cost(i, b); });
      for (int32_t j = 0; j < k; ++j) weights(i, order[static_cast<std::size_t>(j)]) = 1.0 / k;
    }
  });
}

}  // namespace detail

TransportResult solve_sinkhorn(
    const ConstMatrixRef<double>& cost, double epsilon, const SinkhornSettings& settings,
    SinkhornDuals& duals,
    MatrixRef<double> weights) {  // NOLINT(performance-unnecessary-value-param)
  return detail::solve_sinkhorn(cost, epsilon, settings, duals, weights, whole(cost), serial());
}

Matrix<double> sinkhorn_plan(const ConstMatrixRef<double>& cost, double epsilon,
                             const SinkhornDuals& duals) {
  Matrix<double> plan(cost.rows(), cost.cols());
  const double mass = 1.0 / static_cast<double>(cost.rows() * cost.cols());
  for (Eigen::Index i = 0; i < cost.rows(); ++i)
    for (Eigen::Index v = 0; v < cost.cols(); ++v)
      plan(i, v) = mass * std::exp((duals.f[static_cast<std::size_t>(i)] +
                                    duals.g[static_cast<std::size_t>(v)] - cost(i, v)) /
                                   epsilon);
  return plan;
}

// A writable Eigen::Ref travels by value (Eigen's advice); passing it on is not a copy of data.
void solve_softmax(const ConstMatrixRef<double>& cost, double epsilon,
                   MatrixRef<double> weights) {  // NOLINT(performance-unnecessary-value-param)
  detail::solve_softmax(cost, epsilon, weights, whole(cost), serial());
}

void solve_greedy(const ConstMatrixRef<double>& cost,
                  MatrixRef<double> weights) {  // NOLINT(performance-unnecessary-value-param)
  detail::solve_top_k(cost, 1, weights, whole(cost), serial());
}

void solve_top_k(const ConstMatrixRef<double>& cost, int32_t k,
                 MatrixRef<double> weights) {  // NOLINT(performance-unnecessary-value-param)
  detail::solve_top_k(cost, k, weights, whole(cost), serial());
}

}  // namespace polyprobe
