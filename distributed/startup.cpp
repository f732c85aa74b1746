// The start-up agreement: every rank ready, and every rank running the same model, data,
// options and backend, or one message on every rank saying which rank differs and how.
#include <polyprobe/distributed.hpp>
#include <polyprobe/error.hpp>

#include <algorithm>
#include <cstdio>
#include <string>

namespace polyprobe::distributed {
namespace {

// "failure\0name\0value\0name\0value..." (the names and values hold no NUL: they are digests,
// option values and plugin names; one that did would only move a field boundary, never hide
// a difference, since the whole text is compared first).
std::string encode(const std::string& failure, const std::vector<StartupFact>& facts) {
  std::string text = failure;
  for (const StartupFact& f : facts) {
    text.push_back('\0');
    text += f.name;
    text.push_back('\0');
    text += f.value;
  }
  return text;
}

std::vector<std::string> fields(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = text.find('\0', start);
    out.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

}  // namespace

std::string digest(std::span<const unsigned char> bytes) {
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char b : bytes) {
    h ^= b;
    h *= 1099511628211ULL;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

void agree_to_start(Job& job, const std::string& failure, const std::vector<StartupFact>& facts) {
  const std::vector<std::string> all =
      job.allgather_text(encode(failure, facts), "the start-up agreement");
  const std::string of = " of " + std::to_string(job.size());
  // Failures first: a rank that cannot start says why; identical reasons are said once.
  std::string failed;
  int failures = 0;
  std::string first_reason;
  bool same_reason = true;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const std::string reason = fields(all[r]).front();
    if (reason.empty()) continue;
    if (failures == 0) first_reason = reason;
    same_reason = same_reason && reason == first_reason;
    ++failures;
    failed += "\n  rank " + std::to_string(r) + of + ": " + reason;
  }
  if (failures == static_cast<int>(all.size()) && same_reason) throw Error(first_reason);
  if (failures > 0)
    throw Error(std::to_string(failures) + " of " + std::to_string(job.size()) +
                " ranks cannot start, so none does:" + failed);
  // Then the facts, every rank against rank 0.
  const std::vector<std::string> lead = fields(all.front());
  std::string differences;
  int shown = 0;
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all.front()) continue;
    const std::vector<std::string> theirs = fields(all[r]);
    bool named = false;
    const auto at = [](const std::vector<std::string>& v, std::size_t i) {
      return i < v.size() ? v[i] : std::string("(not stated)");
    };
    for (std::size_t f = 1; f < std::max(lead.size(), theirs.size()); f += 2) {
      const std::string name = at(lead, f), a = at(lead, f + 1), b = at(theirs, f + 1);
      if (at(theirs, f) == name && a == b) continue;
      named = true;
      if (++shown > 8) break;
      differences += "\n  rank " + std::to_string(r) + ": " + name + " is '" + b +
                     "', rank 0's is '" + a + "'";
    }
    if (!named) differences += "\n  rank " + std::to_string(r) + ": its facts differ from rank 0's";
  }
  if (!differences.empty())
    throw Error(
        "the ranks disagree about the run (every rank must train the same model on the "
        "same data with the same options):" +
        differences);
}

}  // namespace polyprobe::distributed
