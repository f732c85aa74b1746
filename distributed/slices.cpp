// The cut of a step's particles into the ranks' slices, and the cost model that balances it.
#include <polyprobe/distributed.hpp>
#include <polyprobe/error.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace polyprobe::distributed {
namespace {
std::size_t idx(int64_t i) { return static_cast<std::size_t>(i); }

// The cut of particles by running sums of their weights (`before`: [P + 1], non-decreasing,
// before[i] the weight of the particles ahead of i): rank r starts at the first particle whose
// weight ahead reaches r / ranks of the total, or at P if none does.
std::vector<int64_t> cut_running_sums(std::span<const double> before, int ranks) {
  const auto particles = static_cast<int64_t>(before.size()) - 1;
  std::vector<int64_t> bounds(idx(ranks) + 1, particles);
  bounds[0] = 0;
  const double total = before.back();
  const auto first = before.begin(), last = before.end() - 1;
  for (int r = 1; r < ranks; ++r)
    bounds[idx(r)] = std::lower_bound(first, last, total * r / ranks) - first;
  return bounds;
}

// The largest slice of `bounds` by the running sums `before`.
double slowest(std::span<const int64_t> bounds, std::span<const double> before) {
  double most = 0;
  for (std::size_t r = 0; r + 1 < bounds.size(); ++r)
    most = std::max(most, before[idx(bounds[r + 1])] - before[idx(bounds[r])]);
  return most;
}
}  // namespace

std::vector<int64_t> particle_slices(int64_t particles, std::span<const char> active, int ranks,
                                     std::span<const double> weights) {
  if (ranks < 1) throw Error("particle_slices: ranks must be >= 1");
  if (!active.empty() && static_cast<int64_t>(active.size()) != particles)
    throw Error("particle_slices: " + std::to_string(active.size()) + " active flags for " +
                std::to_string(particles) + " particles");
  if (!weights.empty() && static_cast<int64_t>(weights.size()) != particles)
    throw Error("particle_slices: " + std::to_string(weights.size()) + " weights for " +
                std::to_string(particles) + " particles");
  if (!weights.empty()) {
    std::vector<double> before(idx(particles) + 1, 0.0);
    for (int64_t i = 0; i < particles; ++i)
      before[idx(i) + 1] =
          before[idx(i)] + (active.empty() || active[idx(i)] != 0 ? weights[idx(i)] : 0.0);
    return cut_running_sums(before, ranks);
  }
  std::vector<int64_t> bounds(idx(ranks) + 1, particles);
  bounds[0] = 0;
  if (active.empty()) {
    for (int r = 1; r < ranks; ++r) bounds[idx(r)] = particles * r / ranks;
    return bounds;
  }
  const int64_t total = std::count_if(active.begin(), active.end(), [](char a) { return a != 0; });
  // Rank r starts at the (total * r / ranks)-th active particle.
  int64_t seen = 0;
  int r = 1;
  for (int64_t i = 0; i < particles && r < ranks; ++i) {
    while (r < ranks && seen == total * r / ranks) bounds[idx(r++)] = i;
    if (active[idx(i)] != 0) ++seen;
  }
  return bounds;
}

const std::vector<double>& SliceBalancer::sums_for(std::span<const char> active) {
  if (active.empty()) return before_;
  if (active.size() + 1 != before_.size())
    throw Error("SliceBalancer: " + std::to_string(active.size()) + " active flags for " +
                std::to_string(before_.size() - 1) + " particles");
  masked_.resize(before_.size());
  masked_[0] = 0;
  for (std::size_t i = 0; i < active.size(); ++i)
    masked_[i + 1] = masked_[i] + (active[i] != 0 ? before_[i + 1] - before_[i] : 0.0);
  return masked_;
}

std::vector<int64_t> SliceBalancer::slices(int64_t particles, std::span<const char> active,
                                           int ranks) {
  if (ranks < 1) throw Error("SliceBalancer: ranks must be >= 1");
  if (static_cast<int64_t>(before_.size()) != particles + 1) {
    before_.resize(idx(particles) + 1);
    for (int64_t i = 0; i <= particles; ++i) before_[idx(i)] = static_cast<double>(i);
    measurements_ = 0;
    held_.clear();
  }
  const std::vector<double>& sums = sums_for(active);
  std::vector<int64_t> best = cut_running_sums(sums, ranks);
  if (held_.size() == best.size() && held_ != best &&
      slowest(held_, sums) <= (1 + kHold) * slowest(best, sums))
    return held_;
  return best;
}

void SliceBalancer::observe(std::span<const int64_t> slices, std::span<const char> active,
                            std::span<const double> times) {
  const std::size_t ranks = times.size();
  const auto particles = static_cast<int64_t>(before_.size()) - 1;
  if (particles < 0 || slices.size() != ranks + 1 || slices.back() != particles)
    throw Error("SliceBalancer::observe: " + std::to_string(slices.size()) + " slice bounds and " +
                std::to_string(ranks) + " times for " +
                std::to_string(std::max<int64_t>(particles, 0)) +
                " particles (call slices() first)");
  const std::vector<double>& sums = sums_for(active);
  predicted_.assign(ranks, 0.0);
  double predicted_total = 0, measured_total = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    predicted_[r] = sums[idx(slices[r + 1])] - sums[idx(slices[r])];
    predicted_total += predicted_[r];
    if (times[r] > 0) measured_total += times[r];
  }
  held_.assign(slices.begin(), slices.end());
  if (!(predicted_total > 0) || !(measured_total > 0)) return;
  const double damping = measurements_++ > 0 ? 0.5 : 1.0;
  // Scaling slice r's estimates by its factor scales its rise in the running sums, which then
  // start from where the slices before it now end: one pass, each element on its own.
  starts_.resize(ranks + 1);
  for (std::size_t r = 0; r <= ranks; ++r) starts_[r] = before_[idx(slices[r])];
  double base = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    double factor = 1;
    if (predicted_[r] > 0 && times[r] > 0) {
      const double ratio = (times[r] / measured_total) / (predicted_[r] / predicted_total);
      factor = 1.0 - damping + damping * ratio;
    }
    const double from = starts_[r];
    double* sum = before_.data();
    for (int64_t i = slices[r] + 1; i <= slices[r + 1]; ++i)
      sum[i] = base + factor * (sum[i] - from);
    if (slices[r + 1] > slices[r]) base = before_[idx(slices[r + 1])];
  }
}

}  // namespace polyprobe::distributed
