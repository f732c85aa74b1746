// The materialised paths, sample-major [rows, features] (materialised_paths.cpp says how):
// `dense` (the changed layers per candidate with its effective weights, later layers one
// GEMM over the group), `inplace` (the same on the one shared parameter copy, one candidate
// at a time, bounded memory) and `fallback` (the whole forward of each materialised candidate
// through the host's layers: relies on no contract, always correct).
//
// dense and fallback run on many workers at once, each on its own scratch (its own parameter
// copy); inplace runs alone (it moves the incumbent cache's effective parameters and puts
// them back), parallel over the batch's rows inside.
#pragma once

#include "context.hpp"

#include <cstdint>

namespace polyprobe::cpu_tbb {

template <class S>
class MaterialisedPaths {
 public:
  using Scratch = WorkerScratch<S>;
  explicit MaterialisedPaths(EvaluationContext<S>& ctx) : ctx_(ctx) {}

  // Each: the losses of group g's candidates into losses[g.begin .. g.end).
  void evaluate_dense(const Candidates& c, const Group& g, Scratch& s, double* losses) const;
  void evaluate_inplace(const Candidates& c, const Group& g, Scratch& s, double* losses);
  void evaluate_fallback(const Candidates& c, const Group& g, Scratch& s, double* losses) const;

 private:
  // The effective parameters of candidate `cand` (those s.touched names) into eff.
  void set_candidate_params(const Candidates& c, int64_t cand, Scratch& s, S* eff) const;

  EvaluationContext<S>& ctx_;
};

}  // namespace polyprobe::cpu_tbb
