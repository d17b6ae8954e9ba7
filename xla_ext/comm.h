// The MPI side of one process set. The communicator is a duplicate of the
// user's, so user MPI traffic never matches ours.
//
// Every collective is a nonblocking call awaited by a coroutine (task.h): the
// coroutine parks its request here and the driver calls Poll(), which tests it
// and resumes the coroutine once it completed. Only the thread driving the
// set (under its driver lock) touches a Comm.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.h"
#include "task.h"

namespace jaxcache {

// Throws "jaxcache: <what> failed: <MPI's error string>" unless rc is MPI_SUCCESS.
void CheckMpi(int rc, const char* what);

class Comm {
 public:
  // What a parked request waits for: the other ranks to arrive (a cycle's
  // allreduce may wait a heartbeat or more), or data moving between ranks that
  // are all in the same step (worth polling without sleeping).
  enum class Wait { kArrival, kTransfer };

  // Duplicates `user_comm` (collective over it). Data movement splits counts
  // above `max_count` elements into several calls; allreduces and broadcasts
  // also split above `chunk_bytes` (0: no such limit).
  Comm(MPI_Comm user_comm, int64_t max_count, int64_t chunk_bytes = 0);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  MPI_Comm handle() const { return comm_; }
  int64_t max_count() const { return max_count_; }
  // Elements of `element_size` bytes per allreduce or broadcast call.
  int64_t ChunkCount(std::size_t element_size) const {
    if (chunk_bytes_ <= 0) return max_count_;
    return std::max<int64_t>(1, std::min<int64_t>(max_count_, chunk_bytes_ / element_size));
  }

  // --- driving --------------------------------------------------------------
  bool parked() const { return static_cast<bool>(waiter_); }
  Wait parked_on() const { return parked_on_; }
  std::chrono::steady_clock::time_point parked_since() const { return parked_at_; }
  // Tests the parked request; if it completed, resumes its coroutine (which
  // runs until it parks again or finishes) and returns true. Watches the abort
  // deadline and the abandon flag (AbandonedError).
  bool Poll();

  // --- awaitable steps ------------------------------------------------------
  // Starts one nonblocking call into a request of this Comm (`start(MPI_Request*)`
  // returns its MPI code) and awaits it: how a collective (collectives/) makes
  // an MPI call that none of the steps below makes.
  template <typename Start>
  Task<> Run(const char* what, Start start) {
    CheckMpi(start(&reqs_[0]), what);
    co_await Await(1, what);
  }
  // The same, doing `meanwhile()` on this thread while the call is in flight
  // (local work that does not touch the call's buffers, e.g. a copy of its input).
  template <typename Start, typename Meanwhile>
  Task<> Run(const char* what, Start start, Meanwhile meanwhile) {
    CheckMpi(start(&reqs_[0]), what);
    meanwhile();
    co_await Await(1, what);
  }
  // Merges a peer's message into this rank's, in place: combine(mine,
  // mine_bytes, theirs, theirs_bytes, theirs_lower) returns the new size of
  // mine; `theirs` is scratch. theirs_lower: theirs comes from lower ranks.
  using CycleCombine = std::function<std::size_t(char*, std::size_t, char*, std::size_t, bool)>;
  // The cycle's allreduce of a message whose size may differ between ranks
  // and shrink as it is combined (*bytes, at most max_bytes everywhere):
  // afterwards *bytes and the message are the same on every rank.
  Task<> CycleAllreduce(char* msg, std::size_t* bytes, std::size_t max_bytes,
                        const CycleCombine& combine);
  Task<> Allreduce(uint64_t* words, int count, MPI_Op op);
  Task<> AllreduceInt(int* value, MPI_Op op);
  // out[r] = rank r's value.
  Task<> AllgatherInt(int value, int* out);
  // Rank 0 receives every rank's bytes (empty on other ranks).
  Task<std::vector<std::vector<char>>> GatherBytes(const std::vector<char>& mine);
  // Rank 0's bytes reach every rank.
  Task<> BroadcastBytes(std::vector<char>* bytes);

  // Data movement. Counts may exceed INT_MAX: split into chunks.
  Task<> AllreduceData(const void* in, void* out, int64_t count, DType dtype, ReduceOp op);
  Task<> BroadcastData(void* buf, int64_t bytes, int root);
  Task<> AllgatherData(const void* in, void* out, int64_t bytes_per_rank);
  // Rank r contributes bytes[r] (this rank's from `in`); out holds them all in rank order.
  Task<> AllgathervData(const void* in, void* out, const std::vector<int64_t>& bytes);
  // Reduces `in` (sum of counts elements) over the ranks; this rank receives
  // block `rank` (counts[rank] elements) in `out`.
  Task<> ReducescatterData(const void* in, void* out, const std::vector<int64_t>& counts,
                           DType dtype, ReduceOp op);
  // bytes[s * size + d]: the bytes rank s sends rank d, the same table on every rank.
  // Sends this rank's row of it (consecutive blocks of `in`) and receives its column
  // (consecutive blocks of `out`).
  Task<> AlltoallData(const void* in, void* out, const std::vector<int64_t>& bytes);
  // One step of a pairwise exchange: sends `send_count` elements to rank `to`
  // while receiving `recv_count` from rank `from` (a zero count skips that side;
  // the peer's matching count is zero too). `what` names the collective in errors.
  Task<> Exchange(const void* send, int64_t send_count, int to, void* recv, int64_t recv_count,
                  int from, DType dtype, const char* what);
  // The same, doing `meanwhile()` on this thread once both sides are posted (local
  // work that does not touch their buffers, e.g. copying this rank's own block).
  template <typename Meanwhile>
  Task<> Exchange(const void* send, int64_t send_count, int to, void* recv, int64_t recv_count, int from,
                  DType dtype, const char* what, Meanwhile meanwhile) {
    const int n = PostExchange(send, send_count, to, recv, recv_count, from, dtype);
    meanwhile();
    if (n > 0) co_await Await(n, what);
  }

  // When > 0, a request that gets no answer for this long means a peer is
  // gone (dead process, failed link): the job is aborted instead of hanging.
  void SetAbortTimeout(double seconds) { abort_timeout_s_ = seconds; }
  // Once `*flag` is set, Poll() stops with AbandonedError: a shutdown that gave
  // up on unresponsive peers must not leave the runtime waiting inside MPI.
  void SetAbandonFlag(const std::atomic<bool>* flag) { abandon_ = flag; }

 private:
  // Awaiting it parks the requests in reqs_[0, n) (already started) until Poll()
  // sees them complete; a request that completed at once does not park.
  struct Parked {
    Comm& comm;
    int n;
    const char* what;
    Wait wait;
    bool await_ready();
    void await_suspend(std::coroutine_handle<> h);
    // Rethrows, inside the coroutine, an error that completing the requests reported.
    void await_resume();
  };
  Parked Await(int n, const char* what, Wait wait = Wait::kTransfer) { return {*this, n, what, wait}; }
  // One step of CycleAllreduce: sends `send_bytes` of `send` to `to` and/or
  // receives at most `recv_max` bytes into `recv` from `from` (null: that
  // side is skipped); *received is how many arrived.
  Task<> CycleStep(const void* send, std::size_t send_bytes, int to, void* recv,
                   std::size_t recv_max, int from, std::size_t* received);
  // Starts Exchange()'s receive and send (a zero count skips that side); returns
  // how many requests it started.
  int PostExchange(const void* send, int64_t send_count, int to, void* recv, int64_t recv_count, int from,
                   DType dtype);
  // Exchange() uses tag 0: cycle messages never match data.
  static constexpr int kCycleTag = 1;
  [[noreturn]] void AbortUnanswered(const char* what, double waited);
  void CheckAbandoned(const char* what) const;

  MPI_Request reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  MPI_Status statuses_[2];  // of the last completed requests (a cycle step's receive size)
  int parked_n_ = 0;
  const char* parked_what_ = "";
  Wait parked_on_ = Wait::kTransfer;
  std::chrono::steady_clock::time_point parked_at_{};
  std::coroutine_handle<> waiter_;
  std::string completion_error_;  // from MPI_Testall, rethrown in the coroutine
  std::vector<char> cycle_scratch_;  // the other ranks' part of the cycle's message

  double abort_timeout_s_ = 0;
  int64_t max_count_;
  int64_t chunk_bytes_;
  const std::atomic<bool>* abandon_ = nullptr;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

// Ends the job from this rank: MPI_Abort on `comm` (which tells the launcher
// to kill every rank), and this process ends even if MPI_Abort returns.
[[noreturn]] void AbortJob(MPI_Comm comm, int code);

// Thrown out of a wait that was abandoned (see SetAbandonFlag).
struct AbandonedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace jaxcache
