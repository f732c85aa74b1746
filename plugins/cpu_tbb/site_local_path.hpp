// The site-local path: a particle whose coordinates all lie in one convolution,
// self-attention or hard mixture-of-experts layer (site_local_path.cpp says how). Built with the
// evaluator: each layer that declares the site-local contract is parsed and probed against its own
// forward (site_local.hpp); a layer that fails is declined with the reason.
//
// decline() answers the planner; prepare() computes per call the incumbent's attention
// internals and expert routes of the layers in use (one thread); evaluate() then runs on many
// workers at once.
#pragma once

#include "context.hpp"
#include "site_local.hpp"

#include <cstdint>
#include <vector>

namespace polyprobe::cpu_tbb {

template <class S>
class SiteLocalPath {
 public:
  using Scratch = WorkerScratch<S>;
  explicit SiteLocalPath(const EvaluationContext<S>& ctx);

  // Decline::none when group g can take the path, else why not (site_not_declared when its
  // layers do not declare the contract at all). `other_forced`: another path was requested.
  Decline decline(const Group& g, bool other_forced) const;
  void prepare();
  void evaluate(const Candidates& c, const Group& g, Scratch& s, double* losses) const;
  const SiteLayer& layer(std::size_t l) const { return site_[l]; }

 private:
  const EvaluationContext<S>& ctx_;
  std::vector<SiteLayer> site_;                // per layer (kind none unless site-local)
  std::vector<Mat<S>> site_qkv_, site_mixed_;  // per call, attention layers in use
  // Per call, for the layers in use: a moe's router scores, each token's expert and each
  // expert's tokens; argmax attention's incumbent keys.
  std::vector<Mat<S>> site_scores_;
  std::vector<std::vector<int32_t>> site_route_;
  std::vector<MoeServed> site_served_;
  std::vector<ArgmaxKeys<S>> site_keys_;
};

}  // namespace polyprobe::cpu_tbb
