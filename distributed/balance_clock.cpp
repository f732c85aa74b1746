// What the ranks' cores decide: which clock the slice balancer reads (choose_balance_clock),
// wall time where every rank has cores of its own, CPU time where the ranks of a node
// oversubscribe its cores; and how the ranks wait for each other (choose_waits), polling on cores
// of their own, pausing on shared ones.
#include <polyprobe/distributed.hpp>
#include <polyprobe/error.hpp>

#include <sched.h>
#include <unistd.h>

#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace polyprobe::distributed {

std::string core_facts(int threads) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '?';
  std::ostringstream out;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof mask, &mask) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mask)) cpus.push_back(c);
  if (threads <= 0) threads = std::max(1, static_cast<int>(cpus.size()));
  out << host << ";" << threads << ";";
  for (std::size_t i = 0; i < cpus.size(); ++i) out << (i > 0 ? "," : "") << cpus[i];
  return out.str();
}

BalanceClock balance_clock_for(const std::vector<std::string>& facts, std::string& why) {
  struct Node {
    int ranks = 0;
    long threads = 0;
    std::set<int> cpus;
  };
  std::map<std::string, Node> nodes;
  for (std::size_t r = 0; r < facts.size(); ++r) {
    const auto garbled = [&] {
      return Error("rank " + std::to_string(r) + " stated its cores as '" + facts[r] +
                   "', not HOST;THREADS;CPUS");
    };
    std::istringstream in(facts[r]);
    std::string host, threads, cpus;
    if (!std::getline(in, host, ';') || !std::getline(in, threads, ';')) throw garbled();
    std::getline(in, cpus);
    Node& node = nodes[host];
    ++node.ranks;
    try {
      node.threads += std::stol(threads);
      std::istringstream list(cpus);
      for (std::string c; std::getline(list, c, ',');)
        if (!c.empty()) node.cpus.insert(std::stoi(c));
    } catch (const std::logic_error&) {  // std::stol's invalid_argument and out_of_range
      throw garbled();
    }
  }
  for (const auto& [host, node] : nodes) {
    // A rank that could not read its affinity states no CPU: count it as one.
    const auto cpus = std::max<std::size_t>(node.cpus.size(), 1);
    if (node.threads > static_cast<long>(cpus)) {
      why = "CPU time: the " + std::to_string(node.ranks) + " ranks on " + host + " run " +
            std::to_string(node.threads) + " threads on " + std::to_string(cpus) +
            " CPUs, so a rank's wall time also counts the others on its cores";
      return BalanceClock::cpu;
    }
  }
  why = "wall time: every rank runs on CPUs of its own (" + std::to_string(facts.size()) +
        " ranks on " + std::to_string(nodes.size()) + (nodes.size() == 1 ? " node" : " nodes") +
        "), and the step waits for the slowest";
  return BalanceClock::wall;
}

BalanceClock choose_balance_clock(Job& job, const std::string& asked, int threads,
                                  std::string& why) {
  if (asked != "auto" && asked != "wall" && asked != "cpu")
    throw Error("the ranks' balance clock must be auto, wall or cpu, not '" + asked + "'");
  // Every rank takes part, whatever was asked, so the calls stay in step.
  const std::vector<std::string> facts =
      job.allgather_text(core_facts(threads), "the ranks' cores");
  const BalanceClock found = balance_clock_for(facts, why);
  if (asked == "auto") return found;
  why = asked == "wall" ? "wall time, as asked" : "CPU time, as asked";
  return asked == "wall" ? BalanceClock::wall : BalanceClock::cpu;
}

void choose_waits(Job& job, const std::string& asked, int threads, std::string& why) {
  if (asked != "auto" && asked != "poll" && asked != "pause")
    throw Error("the ranks' waits must be auto, poll or pause, not '" + asked + "'");
  // Every rank takes part, whatever was asked, so the calls stay in step.
  const std::vector<std::string> facts =
      job.allgather_text(core_facts(threads), "the ranks' cores");
  std::string shared;
  const bool own = balance_clock_for(facts, shared) == BalanceClock::wall;
  const bool poll = asked == "auto" ? own : asked == "poll";
  job.set_polling(poll);
  why = std::string(poll ? "poll" : "pause after 200 us") +
        (asked != "auto" ? " (as asked)"
         : own           ? " (every rank has CPUs of its own)"
                         : " (ranks share CPUs)");
}

}  // namespace polyprobe::distributed
