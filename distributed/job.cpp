// The MPI job: joining, the watched collectives, ending the job from one rank.
#include <polyprobe/distributed.hpp>
#include <polyprobe/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace polyprobe::distributed {
namespace {

// Says which MPI call failed and why, on this rank, and ends the job: MPI errors return
// (MPI_ERRORS_RETURN) instead of aborting silently inside the library.
void check(const Job& job, int code, const char* call, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  job.abort(std::string(call) + " failed during " + what + ": " + std::string(text, length), 0);
}

int as_count(const Job& job, int64_t n, const char* what) {
  if (n < 0 || n > INT_MAX)
    job.abort(std::string(what) + ": " + std::to_string(n) +
                  " values in one rank's slice exceed MPI's int counts; use more ranks",
              0);
  return static_cast<int>(n);
}

// Waits for `request`: first polling it, yielding the core between tests, for up to 200 us (the
// step's small exchanges, whose partners arrive within microseconds: a sleep, at least the
// kernel's 50 us timer slack, would cost more than the exchange), then, unless the job polls
// (Job::set_polling: every rank has CPUs of its own), testing it with a growing pause (50 us to
// 200 us), so that a rank that finished its slice early leaves shared cores to the ranks still
// computing. Past the job's timeout it ends the job, naming `what`.
void wait(const Job& job, MPI_Request& request, const char* what) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  constexpr auto kPoll = std::chrono::microseconds(200);
  auto pause = std::chrono::microseconds(50);
  for (;;) {
    int done = 0;
    check(job, MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test", what);
    if (done != 0) return;
    const auto waited = Clock::now() - start;
    if (job.timeout_s() > 0 && std::chrono::duration<double>(waited).count() > job.timeout_s())
      job.abort("no answer from every rank within " + std::to_string(job.timeout_s()) +
                    " s during " + what +
                    ": a rank died or hangs (or its work takes longer: raise --rank-timeout)",
                0);
    if (waited < kPoll || job.polling()) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(200));
  }
}

}  // namespace

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

Job::Job(double timeout_s) : timeout_s_(timeout_s) {
  if (!launched_by_mpi()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0)
    throw Error(
        "MPI was already finalised in this process (the Job that joined it ended), and MPI "
        "cannot be joined twice: keep one Job for the life of the process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw Error(
          "MPI_Init_thread failed: this process was started by an MPI launcher but "
          "cannot join its job");
    owns_mpi_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

Job::~Job() {
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0) MPI_Finalize();
}

namespace {
// Throws unless `bounds` are ranks + 1 entries from 0 to `values` (their order is the caller's).
void check_bounds(std::span<const int64_t> bounds, int ranks, std::size_t values, const char* call,
                  const char* what) {
  if (static_cast<int>(bounds.size()) != ranks + 1 || bounds.front() != 0 ||
      bounds.back() != static_cast<int64_t>(values))
    throw Error(std::string(call) + " (" + what + "): " + std::to_string(bounds.size()) +
                " bounds for " + std::to_string(ranks) + " ranks and " + std::to_string(values) +
                " values");
}
}  // namespace

void Job::allgather(std::span<double> values, std::span<const int64_t> offsets, const char* what) {
  check_bounds(offsets, size_, values.size(), "allgather", what);
  if (size_ == 1) return;
  std::vector<int> counts(static_cast<std::size_t>(size_)), displs(counts.size());
  for (int r = 0; r < size_; ++r) {
    const auto i = static_cast<std::size_t>(r);
    counts[i] = as_count(*this, offsets[i + 1] - offsets[i], what);
    displs[i] = as_count(*this, offsets[i], what);
  }
  MPI_Request request = MPI_REQUEST_NULL;
  check(*this,
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, values.data(), counts.data(),
                        displs.data(), MPI_DOUBLE, MPI_COMM_WORLD, &request),
        "MPI_Iallgatherv", what);
  wait(*this, request, what);
}

void Job::redistribute(std::span<double> values, std::span<const int64_t> from,
                       std::span<const int64_t> to, const char* what) {
  check_bounds(from, size_, values.size(), "redistribute", what);
  check_bounds(to, size_, values.size(), "redistribute", what);
  if (size_ == 1) return;
  const auto me = static_cast<std::size_t>(rank_);
  // What this rank sends to rank r: its own values inside r's wanted range; what it receives
  // from r: r's own values inside its wanted range. Each value travels once, to where it is
  // wanted, and the send and receive ranges never overlap (a rank sends only what it owns).
  std::vector<MPI_Request> requests;
  const auto post = [&](bool send, int peer, int64_t first, int64_t last) {
    if (last <= first) return;
    constexpr int kTag = 0x5eed;
    requests.push_back(MPI_REQUEST_NULL);
    double* data = values.data() + first;
    const int count = as_count(*this, last - first, what);
    check(*this,
          send ? MPI_Isend(data, count, MPI_DOUBLE, peer, kTag, MPI_COMM_WORLD, &requests.back())
               : MPI_Irecv(data, count, MPI_DOUBLE, peer, kTag, MPI_COMM_WORLD, &requests.back()),
          send ? "MPI_Isend" : "MPI_Irecv", what);
  };
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const auto i = static_cast<std::size_t>(r);
    post(true, r, std::max(from[me], to[i]), std::min(from[me + 1], to[i + 1]));
    post(false, r, std::max(from[i], to[me]), std::min(from[i + 1], to[me + 1]));
  }
  for (MPI_Request& request : requests) wait(*this, request, what);
}

void Job::broadcast(std::span<double> values, int root, const char* what) {
  if (size_ == 1) return;
  MPI_Request request = MPI_REQUEST_NULL;
  check(*this,
        MPI_Ibcast(values.data(), as_count(*this, static_cast<int64_t>(values.size()), what),
                   MPI_DOUBLE, root, MPI_COMM_WORLD, &request),
        "MPI_Ibcast", what);
  wait(*this, request, what);
}

void Job::broadcast(std::span<uint32_t> values, int root, const char* what) {
  if (size_ == 1) return;
  MPI_Request request = MPI_REQUEST_NULL;
  check(*this,
        MPI_Ibcast(values.data(), as_count(*this, static_cast<int64_t>(values.size()), what),
                   MPI_UINT32_T, root, MPI_COMM_WORLD, &request),
        "MPI_Ibcast", what);
  wait(*this, request, what);
}

std::vector<std::string> Job::allgather_text(const std::string& text, const char* what) {
  if (size_ == 1) return {text};
  std::vector<int> lengths(static_cast<std::size_t>(size_));
  int mine = as_count(*this, static_cast<int64_t>(text.size()), what);
  MPI_Request request = MPI_REQUEST_NULL;
  check(*this,
        MPI_Iallgather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD, &request),
        "MPI_Iallgather", what);
  wait(*this, request, what);
  std::vector<int> displs(lengths.size());
  int64_t total = 0;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    displs[r] = as_count(*this, total, what);
    total += lengths[r];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  check(*this,
        MPI_Iallgatherv(text.data(), mine, MPI_CHAR, all.data(), lengths.data(), displs.data(),
                        MPI_CHAR, MPI_COMM_WORLD, &request),
        "MPI_Iallgatherv", what);
  wait(*this, request, what);
  std::vector<std::string> texts;
  for (std::size_t r = 0; r < lengths.size(); ++r)
    texts.push_back(
        all.substr(static_cast<std::size_t>(displs[r]), static_cast<std::size_t>(lengths[r])));
  return texts;
}

void Job::abort(const std::string& message, double grace_s) const {
  if (size_ > 1 && rank_ != 0 && grace_s > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(grace_s));
  std::fprintf(stderr, "polyprobe: rank %d of %d: error: %s; ending the job on every rank\n", rank_,
               size_, message.c_str());
  std::fflush(stderr);
  if (size_ > 1 || owns_mpi_) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace polyprobe::distributed
