// The transport solvers on the optimizer's threads (internal). The same results as the
// public serial forms in <polyprobe/transport.hpp>, bit for bit, for any thread count when the
// problem starts at a multiple of StepShard::kGrain particles: rows are independent, and
// Sinkhorn's column sums add fixed chunks of rows (RowChunks) in chunk order. With a shard, a
// process computes the plan's rows and the row duals f of its own chunks (the column partials
// are shared, so the column duals g come out whole on every process; f's other rows are left
// as they were: StepEngine gathers them when they are needed).
#pragma once

#include "row_chunks.hpp"
#include "step_threads.hpp"

#include <polyprobe/transport.hpp>

namespace polyprobe::detail {

TransportResult solve_sinkhorn(const ConstMatrixRef<double>& cost, double epsilon,
                               const SinkhornSettings& settings, SinkhornDuals& duals,
                               MatrixRef<double> weights, const RowChunks& chunks,
                               const StepThreads& threads);
void solve_softmax(const ConstMatrixRef<double>& cost, double epsilon, MatrixRef<double> weights,
                   const RowChunks& chunks, const StepThreads& threads);
// solve_greedy is solve_top_k with k = 1.
void solve_top_k(const ConstMatrixRef<double>& cost, int32_t k, MatrixRef<double> weights,
                 const RowChunks& chunks, const StepThreads& threads);

}  // namespace polyprobe::detail
