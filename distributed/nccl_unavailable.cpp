// make_nccl_exchange and nccl_unusable in builds without NCCL (POLYPROBE_NCCL off or not found).
#include <polyprobe/distributed.hpp>
#include <polyprobe/error.hpp>

namespace polyprobe::distributed {

bool nccl_built() { return false; }

std::string nccl_unusable() {
  return "this polyprobe was built without NCCL (configure with -DPOLYPROBE_NCCL=ON and the CUDA "
         "Toolkit's libnccl in /usr/local/cuda)";
}

std::unique_ptr<LossExchange> make_nccl_exchange(Job&, int) {
  throw Error(
      "this polyprobe was built without NCCL (configure with -DPOLYPROBE_NCCL=ON and the "
      "CUDA Toolkit's libnccl in /usr/local/cuda); the MPI exchange carries the losses");
}

}  // namespace polyprobe::distributed
