// The MPI side of the runtime. Only the background thread calls into a Comm.
// The communicator is a duplicate of the user's, so user MPI traffic never
// matches ours.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <functional>
#include <vector>

#include "common.h"

namespace jaxcache {

class Comm {
 public:
  // Duplicates `user_comm` (collective over it). Data movement splits counts
  // above `max_count` elements into several calls.
  Comm(MPI_Comm user_comm, int64_t max_count);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // The cycle's allreduce: posted by one thread, tested by whichever thread
  // drives the runtime next (in place, one element of `type`).
  void PostCycle(void* buf, MPI_Datatype type, MPI_Op op);
  bool cycle_posted() const { return cycle_ != MPI_REQUEST_NULL; }
  // True once every rank has joined the posted cycle. Watches the abort
  // deadline and the abandon flag (AbandonedError).
  bool TestCycle();
  void Allreduce(uint64_t* words, int count, MPI_Op op);
  void AllreduceInt(int* value, MPI_Op op);
  // out[r] = rank r's value.
  void AllgatherInt(int value, int* out);

  // Rank 0 receives every rank's bytes (empty on other ranks).
  std::vector<std::vector<char>> GatherBytes(const std::vector<char>& mine);
  // Rank 0's bytes reach every rank.
  void BroadcastBytes(std::vector<char>* bytes);

  // Data movement. Counts may exceed INT_MAX: split into chunks.
  void AllreduceData(const void* in, void* out, int64_t count, DType dtype, ReduceOp op);
  void BroadcastData(void* buf, int64_t bytes, int root);
  void AllgatherData(const void* in, void* out, int64_t bytes_per_rank);
  // Rank r contributes bytes[r] (this rank's from `in`); out holds them all in rank order.
  void AllgathervData(const void* in, void* out, const std::vector<int64_t>& bytes);
  // Reduces `in` (sum of counts elements) over the ranks; this rank receives
  // block `rank` (counts[rank] elements) in `out`.
  void ReducescatterData(const void* in, void* out, const std::vector<int64_t>& counts,
                         DType dtype, ReduceOp op);
  // Sends send[d] bytes to each rank d (consecutive blocks of `in`) and
  // receives recv[s] bytes from each rank s (consecutive blocks of `out`).
  // `largest`: the largest number of bytes any rank sends any rank.
  void AlltoallData(const void* in, const std::vector<int64_t>& send, void* out,
                    const std::vector<int64_t>& recv, int64_t largest);

  MPI_Comm handle() const { return comm_; }

  // When > 0, a collective that gets no answer for this long means a peer is
  // gone (dead process, failed link): the job is aborted instead of hanging.
  // Data movement then uses nonblocking calls so that it can be watched too.
  void SetAbortTimeout(double seconds) { abort_timeout_s_ = seconds; }
  // Once `*flag` is set, polled waits stop with AbandonedError: a shutdown
  // that gave up on unresponsive peers must not leave the thread inside MPI.
  void SetAbandonFlag(const std::atomic<bool>* flag) { abandon_ = flag; }
  int64_t max_count() const { return max_count_; }

 private:
  // Spins on `reqs` (data movement needs MPI progress), watching the deadline.
  void WaitWatched(MPI_Request* reqs, const char* what, int n = 1);
  // One collective call: blocking, or nonblocking and watched when an abort
  // timeout is set (`start` begins the nonblocking call).
  template <typename Blocking, typename Start>
  void Collective(const char* what, Blocking&& blocking, Start&& start);
  [[noreturn]] void AbortUnanswered(const char* what, double waited);
  void CheckAbandoned(const char* what) const;
  double abort_timeout_s_ = 0;
  MPI_Request cycle_ = MPI_REQUEST_NULL;
  std::chrono::steady_clock::time_point cycle_posted_at_{};
  int64_t max_count_;
  const std::atomic<bool>* abandon_ = nullptr;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

// Thrown out of a wait that was abandoned (see SetAbandonFlag).
struct AbandonedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace jaxcache
