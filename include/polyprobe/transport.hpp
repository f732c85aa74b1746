// Transport solvers: from a particles x vertices cost matrix to move weights.
//
// Every solver returns row weights W (P x V, each row sums to 1): particle i moves to
// sum_v W[i, v] Y_iv. Sinkhorn solves the entropic optimal-transport problem between P
// particles and V vertices with uniform marginals in the log domain (stable for any epsilon),
// warm-started from the duals it is given and leaving the new duals in place; the softmax is
// its one-sided relaxation (rows only); greedy and top-k select vertices instead of weighting
// them. Costs must be finite (the optimizer replaces non-finite ones by a penalty first).
#pragma once

#include <polyprobe/tensor.hpp>

#include <cstdint>
#include <string_view>
#include <vector>

namespace polyprobe {

enum class TransportSolver {
  automatic,  // sinkhorn in full space, softmax in a subspace (polystep's choice)
  sinkhorn,   // log-domain Sinkhorn, uniform marginals, warm-started duals
  softmax,    // row-wise softmax(-C / eps)
  greedy,     // all weight on the cheapest vertex of each row
  top_k,      // equal weight on the k cheapest vertices of each row
};

TransportSolver parse_transport_solver(std::string_view name);
std::string_view to_string(TransportSolver solver);

// How a block's cost matrix is rescaled before the solve (polystep's scale_cost).
enum class CostScaling {
  none,      // as measured
  mean,      // divide by the mean absolute cost
  max_cost,  // divide by the largest absolute cost
  min_max,   // subtract the minimum, divide by the range (maps to [0, 1])
};

CostScaling parse_cost_scaling(std::string_view name);
std::string_view to_string(CostScaling scaling);

// Warm-startable Sinkhorn duals of one block: f (P) and g (V), in units of the cost.
struct SinkhornDuals {
  std::vector<double> f, g;
};

struct TransportResult {
  int32_t iterations = 0;     // Sinkhorn iterations run (0 for the closed-form rules)
  double marginal_error = 0;  // Sinkhorn: max |column sum - 1/V| * V at exit
  bool converged = true;
};

struct SinkhornSettings {
  int32_t max_iterations = 2000;
  double tolerance = 1e-6;  // on the relative column-marginal error
};

// Rescales `cost` in place.
void scale_cost(CostScaling scaling, MatrixRef<double> cost);

// The log-domain Sinkhorn plan, row-normalised into `weights`. `duals` warm-starts the solve
// when its sizes match and receives the new duals.
TransportResult solve_sinkhorn(const ConstMatrixRef<double>& cost, double epsilon,
                               const SinkhornSettings& settings, SinkhornDuals& duals,
                               MatrixRef<double> weights);
// The full (not row-normalised) plan: pi = exp((f_i + g_v - C_iv) / eps) / (P V), for tests.
Matrix<double> sinkhorn_plan(const ConstMatrixRef<double>& cost, double epsilon,
                             const SinkhornDuals& duals);
void solve_softmax(const ConstMatrixRef<double>& cost, double epsilon, MatrixRef<double> weights);
void solve_greedy(const ConstMatrixRef<double>& cost, MatrixRef<double> weights);
void solve_top_k(const ConstMatrixRef<double>& cost, int32_t k, MatrixRef<double> weights);

}  // namespace polyprobe
