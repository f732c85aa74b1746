// How the losses cross between ranks: the MPI exchange (host buffers), and the choice between
// it and the NCCL one (nccl_exchange.cpp) that `train --rank-exchange` makes on every rank.
#include <polyprobe/distributed.hpp>
#include <polyprobe/error.hpp>

#include <string>
#include <vector>

namespace polyprobe::distributed {
namespace {

class MpiExchange final : public LossExchange {
 public:
  explicit MpiExchange(Job& job) : job_(job) {}
  void allgather(std::span<double> values, std::span<const int64_t> offsets) override {
    job_.allgather(values, offsets, "the step's loss exchange");
  }
  void redistribute(std::span<double> values, std::span<const int64_t> from,
                    std::span<const int64_t> to) override {
    job_.redistribute(values, from, to, "the step's losses, to the ranks finishing them");
  }
  void broadcast_from_leader(double& value) override {
    job_.broadcast(std::span<double>(&value, 1), 0, "the incumbent loss broadcast");
  }
  std::string name() const override { return "mpi"; }

 private:
  Job& job_;
};

}  // namespace

std::unique_ptr<LossExchange> make_mpi_exchange(Job& job) {
  return std::make_unique<MpiExchange>(job);
}

std::unique_ptr<LossExchange> choose_exchange(Job& job, const std::string& asked, bool gpu_backend,
                                              std::string& why) {
  if (asked != "auto" && asked != "mpi" && asked != "nccl")
    throw Error("--rank-exchange: '" + asked + "' is not one of auto, mpi, nccl");
  if (asked == "mpi") {
    why = "--rank-exchange mpi";
    return make_mpi_exchange(job);
  }
  if (asked == "auto" && !gpu_backend) {
    why = "the backend's losses are in host memory";
    return make_mpi_exchange(job);
  }
  // Every rank states whether it could join NCCL; all choose from the same verdicts.
  const std::vector<std::string> verdicts =
      job.allgather_text(nccl_unusable(), "the ranks' NCCL verdicts");
  for (std::size_t r = 0; r < verdicts.size(); ++r) {
    if (verdicts[r].empty()) continue;
    const std::string reason = "rank " + std::to_string(r) + " cannot use NCCL: " + verdicts[r];
    if (asked == "nccl")
      throw Error("--rank-exchange nccl: " + reason +
                  " (use --rank-exchange mpi, or auto to let polyprobe choose)");
    why = reason;
    return make_mpi_exchange(job);
  }
  why = asked == "nccl" ? "--rank-exchange nccl" : "a GPU backend, and a GPU for every rank";
  return make_nccl_exchange(job);
}

}  // namespace polyprobe::distributed
