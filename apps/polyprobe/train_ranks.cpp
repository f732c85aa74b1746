// TrainRanks over polyprobe_distributed when the build has MPI, else a process alone.
#include "train_ranks.hpp"

#include <polyprobe/error.hpp>

#if POLYPROBE_HAVE_MPI
#include <polyprobe/distributed.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace polyprobe::app {
namespace {

// Discards what is written to it: the voice of the ranks other than 0.
class NullBuffer final : public std::streambuf {
 protected:
  int overflow(int c) override { return traits_type::not_eof(c); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

// The rank count mpirun launched, read from its environment (1 when none).
[[maybe_unused]] int launched_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* value = std::getenv(name)) return std::max(1, std::atoi(value));
  return 1;
}

}  // namespace

#if POLYPROBE_HAVE_MPI
struct TrainRanks::Impl {
  explicit Impl(double timeout_s) : job(timeout_s) {}
  distributed::Job job;
  std::unique_ptr<distributed::LossExchange> exchange;  // chosen by shard()
};
#else
struct TrainRanks::Impl {};
#endif

TrainRanks::TrainRanks(double timeout_s) {
#if POLYPROBE_HAVE_MPI
  impl_ = std::make_unique<Impl>(timeout_s);
  rank_ = impl_->job.rank();
  size_ = impl_->job.size();
#else
  (void)timeout_s;
  if (launched_size() > 1)
    throw Error("mpirun started " + std::to_string(launched_size()) +
                " ranks, but this polyprobe was built without MPI, so each would train the whole "
                "run alone; install libopenmpi-dev (scripts/install-deps.sh) and rebuild "
                "(-DPOLYPROBE_MPI=ON), or run it without mpirun");
#endif
  if (!leader()) {
    // For the rest of the process: the error run_command would print after run() returns is
    // rank 0's to print too. The buffer is never destroyed: the standard streams flush it
    // during static destruction, after any function-local static would be gone.
    static NullBuffer* const silence = new NullBuffer;
    std::cout.rdbuf(silence);
    std::cerr.rdbuf(silence);
  }
}

TrainRanks::~TrainRanks() = default;

std::string TrainRanks::exchange() const {
#if POLYPROBE_HAVE_MPI
  if (impl_->exchange) return impl_->exchange->name() + ", why: " + exchange_why_;
#endif
  return "";
}

void TrainRanks::agree_to_start(const std::string& failure,
                                const std::vector<std::pair<std::string, std::string>>& facts) {
  asked_ = true;
#if POLYPROBE_HAVE_MPI
  if (size_ == 1) {
    if (!failure.empty()) throw Error(failure);
    agreed_ = true;
    return;
  }
  std::vector<distributed::StartupFact> stated;
  stated.reserve(facts.size());
  for (const auto& [name, value] : facts) stated.push_back({name, value});
  distributed::agree_to_start(impl_->job, failure, stated);
  agreed_ = true;  // from here on a failure of one rank ends the job (fail)
#else
  (void)facts;
  if (!failure.empty()) throw Error(failure);
#endif
}

std::unique_ptr<Evaluator> TrainRanks::shard(std::unique_ptr<Evaluator> evaluator,
                                             const std::string& exchange, bool gpu_backend,
                                             const std::string& balance, const std::string& waits) {
#if POLYPROBE_HAVE_MPI
  if (size_ > 1) {
    impl_->exchange =
        distributed::choose_exchange(impl_->job, exchange, gpu_backend, exchange_why_);
    const distributed::BalanceClock clock =
        distributed::choose_balance_clock(impl_->job, balance, evaluator->threads(), balance_why_);
    distributed::choose_waits(impl_->job, waits, evaluator->threads(), waits_why_);
    return distributed::shard_evaluator(std::move(evaluator), impl_->job, *impl_->exchange, nullptr,
                                        clock);
  }
#else
  (void)exchange, (void)gpu_backend, (void)balance, (void)waits;
#endif
  return evaluator;
}

nlohmann::json TrainRanks::shard_account(const Evaluator& evaluator) const {
#if POLYPROBE_HAVE_MPI
  return distributed::shard_account(evaluator);
#else
  (void)evaluator;
  return nlohmann::json::object();
#endif
}

std::function<uint32_t(uint32_t)> TrainRanks::stop_agreement() {
#if POLYPROBE_HAVE_MPI
  if (size_ > 1)
    return [this](uint32_t reasons) {
      impl_->job.broadcast(std::span<uint32_t>(&reasons, 1), 0, "the stop agreement");
      return reasons;
    };
#endif
  return nullptr;
}

std::function<double(double)> TrainRanks::clock_agreement() {
#if POLYPROBE_HAVE_MPI
  if (size_ > 1)
    return [this](double seconds) {
      impl_->job.broadcast(std::span<double>(&seconds, 1), 0, "the schedule's clock");
      return seconds;
    };
#endif
  return nullptr;
}

void TrainRanks::fail(const std::string& message) {
#if POLYPROBE_HAVE_MPI
  impl_->job.abort(message);
#else
  std::fprintf(stderr, "polyprobe: error: %s\n", message.c_str());
  std::_Exit(1);
#endif
}

void TrainRanks::sync() {
#if POLYPROBE_HAVE_MPI
  uint32_t token = 0;
  impl_->job.broadcast(std::span<uint32_t>(&token, 1), 0, "a barrier");
#endif
}

std::vector<std::string> TrainRanks::gather(const std::string& text) {
#if POLYPROBE_HAVE_MPI
  return impl_->job.allgather_text(text, "gathering the ranks' reports");
#else
  return {text};
#endif
}

bool leader_process() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* value = std::getenv(name)) return std::atoi(value) == 0;
  return true;
}

std::string TrainRanks::digest(const void* data, std::size_t bytes) {
#if POLYPROBE_HAVE_MPI
  return distributed::digest({static_cast<const unsigned char*>(data), bytes});
#else
  (void)data, (void)bytes;
  return "";
#endif
}

}  // namespace polyprobe::app
