// The cut of a step's particles into the ranks' slices, and the cost model that balances it.
#include <polyprobe/distributed.hpp>
#include <polyprobe/error.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace polyprobe::distributed {
namespace {
std::size_t idx(int64_t i) { return static_cast<std::size_t>(i); }
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
  std::vector<int64_t> bounds(static_cast<std::size_t>(ranks) + 1, particles);
  bounds[0] = 0;
  if (!weights.empty()) {
    const auto counts = [&](int64_t i) {
      return active.empty() || active[static_cast<std::size_t>(i)] != 0;
    };
    double total = 0;
    for (int64_t i = 0; i < particles; ++i)
      if (counts(i)) total += weights[static_cast<std::size_t>(i)];
    double before = 0;
    int r = 1;
    for (int64_t i = 0; i < particles && r < ranks; ++i) {
      while (r < ranks && before >= total * r / ranks) bounds[static_cast<std::size_t>(r++)] = i;
      if (counts(i)) before += weights[static_cast<std::size_t>(i)];
    }
    return bounds;
  }
  if (active.empty()) {
    for (int r = 1; r < ranks; ++r) bounds[static_cast<std::size_t>(r)] = particles * r / ranks;
    return bounds;
  }
  const int64_t total = std::count_if(active.begin(), active.end(), [](char a) { return a != 0; });
  // Rank r starts at the (total * r / ranks)-th active particle.
  int64_t seen = 0;
  int r = 1;
  for (int64_t i = 0; i < particles && r < ranks; ++i) {
    while (r < ranks && seen == total * r / ranks) bounds[static_cast<std::size_t>(r++)] = i;
    if (active[static_cast<std::size_t>(i)] != 0) ++seen;
  }
  return bounds;
}

// The predicted cost of the slowest slice of `bounds`.
double SliceBalancer::slowest(std::span<const int64_t> bounds, std::span<const char> active) const {
  double most = 0;
  for (std::size_t r = 0; r + 1 < bounds.size(); ++r) {
    double sum = 0;
    for (int64_t i = bounds[r]; i < bounds[r + 1]; ++i)
      if (active.empty() || active[idx(i)] != 0) sum += cost_[idx(i)];
    most = std::max(most, sum);
  }
  return most;
}

std::vector<int64_t> SliceBalancer::slices(int64_t particles, std::span<const char> active,
                                           int ranks) {
  if (static_cast<int64_t>(cost_.size()) != particles) {
    cost_.assign(idx(particles), 1.0);
    measurements_ = 0;
    held_.clear();
  }
  std::vector<int64_t> best = particle_slices(particles, active, ranks, cost_);
  if (held_.size() == best.size() && held_ != best &&
      slowest(held_, active) <= (1 + kHold) * slowest(best, active))
    return held_;
  return best;
}

void SliceBalancer::observe(std::span<const int64_t> slices, std::span<const char> active,
                            std::span<const double> times) {
  const std::size_t ranks = times.size();
  if (slices.size() != ranks + 1 || slices.back() != static_cast<int64_t>(cost_.size()))
    throw Error("SliceBalancer::observe: " + std::to_string(slices.size()) + " slice bounds and " +
                std::to_string(ranks) + " times for " + std::to_string(cost_.size()) +
                " particles (call slices() first)");
  predicted_.assign(ranks, 0.0);
  double predicted_total = 0, measured_total = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    for (int64_t i = slices[r]; i < slices[r + 1]; ++i)
      if (active.empty() || active[idx(i)] != 0) predicted_[r] += cost_[idx(i)];
    predicted_total += predicted_[r];
    if (times[r] > 0) measured_total += times[r];
  }
  held_.assign(slices.begin(), slices.end());
  if (!(predicted_total > 0) || !(measured_total > 0)) return;
  const double damping = measurements_++ > 0 ? 0.5 : 1.0;
  for (std::size_t r = 0; r < ranks; ++r) {
    if (!(predicted_[r] > 0) || !(times[r] > 0)) continue;
    const double ratio = (times[r] / measured_total) / (predicted_[r] / predicted_total);
    const double factor = 1.0 - damping + damping * ratio;
    for (int64_t i = slices[r]; i < slices[r + 1]; ++i) cost_[idx(i)] *= factor;
  }
}

}  // namespace polyprobe::distributed
