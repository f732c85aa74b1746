// The NCCL loss exchange on every rank of `mpirun -np N` (one GPU a rank, or ranks sharing one
// GPU when NCCL allows it; when it refuses, the test says so and skips): each rank fills its slice
// with values naming the rank and the index, the exchange all-gathers them, every rank checks every
// value; then the values are redistributed to another cut and each rank checks the ones it wants;
// then rank 0's incumbent loss is broadcast. Exits 77 (ctest's skip) with the reason when no
// GPU is visible.
#include <polyprobe/distributed.hpp>

#include <cuda_runtime.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <vector>

int main() {
  using namespace polyprobe::distributed;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device is visible (the NCCL exchange needs one a rank)\n");
    return 77;
  }
  Job job;
  try {
    std::unique_ptr<LossExchange> exchange;
    try {
      exchange = make_nccl_exchange(job);
    } catch (const std::exception& e) {
      // NCCL may refuse several ranks of one communicator on one device ("Duplicate GPU"):
      // that is NCCL's answer to ranks sharing a GPU, reported rather than failed.
      if (job.size() > devices) {
        std::printf("skipped: NCCL refused %d ranks on %d visible device(s): %s\n", job.size(),
                    devices, e.what());
        return 77;
      }
      throw;
    }
    const int64_t total = 1000003;  // odd, so the slices differ in length
    std::vector<int64_t> offsets;
    for (int r = 0; r <= job.size(); ++r) offsets.push_back(total * r / job.size());
    std::vector<double> values(static_cast<std::size_t>(total), -1.0);
    const auto mine = static_cast<std::size_t>(job.rank());
    for (int64_t i = offsets[mine]; i < offsets[mine + 1]; ++i)
      values[static_cast<std::size_t>(i)] = 1000.0 * job.rank() + 1e-3 * static_cast<double>(i);
    exchange->allgather(values, offsets);
    int64_t wrong = 0;
    for (int r = 0; r < job.size(); ++r)
      for (int64_t i = offsets[static_cast<std::size_t>(r)];
           i < offsets[static_cast<std::size_t>(r) + 1]; ++i)
        wrong += values[static_cast<std::size_t>(i)] != 1000.0 * r + 1e-3 * static_cast<double>(i);
    // Redistribute: rank r owns its slice of `offsets` and wants another cut's (the last rank
    // the most), so most values cross; only the wanted ones are checked.
    std::vector<int64_t> wanted{0};
    const int64_t weight_sum = static_cast<int64_t>(job.size()) * (job.size() + 1) / 2;
    for (int r = 1; r <= job.size(); ++r)
      wanted.push_back(total * (static_cast<int64_t>(r) * (r + 1) / 2) / weight_sum);
    std::vector<double> moved(static_cast<std::size_t>(total), -1.0);
    for (int64_t i = offsets[mine]; i < offsets[mine + 1]; ++i)
      moved[static_cast<std::size_t>(i)] = 1e-3 * static_cast<double>(i);
    exchange->redistribute(moved, offsets, wanted);
    for (int64_t i = wanted[mine]; i < wanted[mine + 1]; ++i)
      wrong += moved[static_cast<std::size_t>(i)] != 1e-3 * static_cast<double>(i);
    double incumbent = job.leader() ? 42.5 : 0.0;
    exchange->broadcast_from_leader(incumbent);
    std::printf("rank %d of %d (%d visible devices): %lld wrong values of %lld, incumbent %g\n",
                job.rank(), job.size(), devices, static_cast<long long>(wrong),
                static_cast<long long>(total), incumbent);
    return wrong == 0 && incumbent == 42.5 ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
