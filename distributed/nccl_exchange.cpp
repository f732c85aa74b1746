// The NCCL loss exchange: one process per GPU, bootstrapped over MPI (rank 0's ncclUniqueId
// broadcast), the losses all-gathered (or sent point to point to the ranks finishing them)
// between device buffers.
//
// The evaluator session hands its losses back in host memory (plugin API 2 writes the [P V K]
// losses to the host), so each exchange copies this rank's slice to the device, exchanges it
// there (all-gather: one in-place ncclBroadcast per rank inside a group, since NCCL has no
// all-gather-v; redistribute: ncclSend/ncclRecv pairs in a group) and copies back what this
// rank wants. A backend that kept its losses on the device could hand that
// buffer to NCCL directly; docs/scale.md says what that would save.
#include <polyprobe/distributed.hpp>
#include <polyprobe/error.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace polyprobe::distributed {
namespace {

void check_cuda(cudaError_t code, const char* call) {
  if (code != cudaSuccess) throw Error(std::string(call) + " failed: " + cudaGetErrorString(code));
}

void check_nccl(ncclResult_t code, const char* call) {
  if (code != ncclSuccess) throw Error(std::string(call) + " failed: " + ncclGetErrorString(code));
}

class NcclExchange final : public LossExchange {
 public:
  NcclExchange(Job& job, int device) : job_(job) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      throw Error(
          "the NCCL exchange needs a CUDA device, and this rank sees none (check the "
          "driver and CUDA_VISIBLE_DEVICES)");
    if (device < 0) {
      const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
      device = (local != nullptr ? std::atoi(local) : job.rank()) % devices;
    }
    device_ = device;
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    ncclUniqueId id{};
    if (job.leader()) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    static_assert(sizeof(ncclUniqueId) % sizeof(uint32_t) == 0);
    std::vector<uint32_t> words(sizeof(ncclUniqueId) / sizeof(uint32_t));
    std::memcpy(words.data(), &id, sizeof id);
    job.broadcast(std::span<uint32_t>(words), 0, "the NCCL bootstrap (ncclUniqueId)");
    std::memcpy(&id, words.data(), sizeof id);
    check_nccl(ncclCommInitRank(&comm_, job.size(), id, job.rank()), "ncclCommInitRank");
  }
  ~NcclExchange() override {
    if (buffer_ != nullptr) cudaFree(buffer_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  NcclExchange(const NcclExchange&) = delete;
  NcclExchange& operator=(const NcclExchange&) = delete;

  void allgather(std::span<double> values, std::span<const int64_t> offsets) override {
    if (static_cast<int>(offsets.size()) != job_.size() + 1 ||
        offsets.back() != static_cast<int64_t>(values.size()))
      throw Error("the NCCL exchange: offsets do not cut the loss buffer into one slice a rank");
    reserve(values.size());
    const auto r = static_cast<std::size_t>(job_.rank());
    const auto first = static_cast<std::size_t>(offsets[r]);
    const auto count = static_cast<std::size_t>(offsets[r + 1] - offsets[r]);
    check_cuda(cudaMemcpyAsync(buffer_ + first, values.data() + first, count * sizeof(double),
                               cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync (slice to the device)");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int root = 0; root < job_.size(); ++root) {
      const auto at = static_cast<std::size_t>(offsets[static_cast<std::size_t>(root)]);
      const auto n = static_cast<std::size_t>(offsets[static_cast<std::size_t>(root) + 1]) - at;
      if (n > 0)
        check_nccl(ncclBroadcast(buffer_ + at, buffer_ + at, n, ncclDouble, root, comm_, stream_),
                   "ncclBroadcast");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    check_cuda(cudaMemcpyAsync(values.data(), buffer_, values.size() * sizeof(double),
                               cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync (losses to the host)");
    wait("the step's loss exchange (NCCL)");
  }

  void redistribute(std::span<double> values, std::span<const int64_t> from,
                    std::span<const int64_t> to) override {
    const auto ranks = static_cast<std::size_t>(job_.size());
    if (from.size() != ranks + 1 || to.size() != ranks + 1 ||
        from.back() != static_cast<int64_t>(values.size()) ||
        to.back() != static_cast<int64_t>(values.size()))
      throw Error("the NCCL exchange: bounds do not cut the loss buffer into one slice a rank");
    reserve(values.size());
    const auto me = static_cast<std::size_t>(job_.rank());
    const auto bytes = [](int64_t n) { return static_cast<std::size_t>(n) * sizeof(double); };
    check_cuda(cudaMemcpyAsync(buffer_ + from[me], values.data() + from[me],
                               bytes(from[me + 1] - from[me]), cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync (slice to the device)");
    // As Job::redistribute: to each peer the part of this rank's values it wants, from each
    // the part of its values this rank wants; the two never overlap.
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (std::size_t r = 0; r < ranks; ++r) {
      if (r == me) continue;
      const int64_t send_first = std::max(from[me], to[r]),
                    send_last = std::min(from[me + 1], to[r + 1]);
      if (send_last > send_first)
        check_nccl(ncclSend(buffer_ + send_first, static_cast<std::size_t>(send_last - send_first),
                            ncclDouble, static_cast<int>(r), comm_, stream_),
                   "ncclSend");
      const int64_t recv_first = std::max(from[r], to[me]),
                    recv_last = std::min(from[r + 1], to[me + 1]);
      if (recv_last > recv_first)
        check_nccl(ncclRecv(buffer_ + recv_first, static_cast<std::size_t>(recv_last - recv_first),
                            ncclDouble, static_cast<int>(r), comm_, stream_),
                   "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    // This rank's own values inside its wanted range came up with the slice, unchanged.
    check_cuda(cudaMemcpyAsync(values.data() + to[me], buffer_ + to[me], bytes(to[me + 1] - to[me]),
                               cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync (losses to the host)");
    wait("the step's losses, to the ranks finishing them (NCCL)");
  }

  void broadcast_from_leader(double& value) override {
    reserve(1);
    check_cuda(cudaMemcpyAsync(buffer_, &value, sizeof(double), cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync");
    check_nccl(ncclBroadcast(buffer_, buffer_, 1, ncclDouble, 0, comm_, stream_), "ncclBroadcast");
    check_cuda(cudaMemcpyAsync(&value, buffer_, sizeof(double), cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync");
    wait("the incumbent loss broadcast (NCCL)");
  }

  std::string name() const override { return "nccl"; }

 private:
  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    if (buffer_ != nullptr) check_cuda(cudaFree(buffer_), "cudaFree");
    buffer_ = nullptr;
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&buffer_), n * sizeof(double)),
               "cudaMalloc (the loss buffer)");
    capacity_ = n;
  }
  // Polls the stream (not a blocking synchronise), so a peer that died is caught by the job's
  // timeout: the communicator is aborted and the job ended, naming `what`.
  void wait(const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) check_cuda(state, what);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        job_.abort(std::string(what) + ": NCCL reports " + ncclGetErrorString(async), 0);
      }
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (job_.timeout_s() > 0 && waited > job_.timeout_s()) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        job_.abort("no answer from every GPU rank within " + std::to_string(job_.timeout_s()) +
                       " s during " + what + " (raise --rank-timeout if steps take this long)",
                   0);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  Job& job_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  double* buffer_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace

bool nccl_built() { return true; }

std::string nccl_unusable() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return "no CUDA device is visible to it (check the driver and CUDA_VISIBLE_DEVICES)";
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int on_node = local != nullptr ? std::max(1, std::atoi(local)) : 1;
  if (on_node > devices)
    return std::to_string(on_node) + " ranks on its node share " + std::to_string(devices) +
           " GPU(s), and NCCL refuses two ranks of one communicator on one GPU";
  return "";
}

std::unique_ptr<LossExchange> make_nccl_exchange(Job& job, int device) {
  return std::make_unique<NcclExchange>(job, device);
}

}  // namespace polyprobe::distributed
