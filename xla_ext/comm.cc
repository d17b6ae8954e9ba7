#include "comm.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "reduce_ops.h"

namespace jaxcache {

namespace {

void Check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string("jaxcache: ") + what + " failed: " + std::string(msg, len));
}
}  // namespace

Comm::Comm(MPI_Comm user_comm, int64_t max_count)
    : max_count_(std::max<int64_t>(1, std::min<int64_t>(max_count, INT_MAX))) {
  Check(MPI_Comm_dup(user_comm, &comm_), "MPI_Comm_dup");
  // Errors come back as codes so the runtime can report them instead of aborting.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm local;
  Check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type");
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
}

Comm::~Comm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void Comm::PostCycle(void* buf, MPI_Datatype type, MPI_Op op) {
  Check(MPI_Iallreduce(MPI_IN_PLACE, buf, 1, type, op, comm_, &cycle_), "MPI_Iallreduce");
  cycle_posted_at_ = std::chrono::steady_clock::now();
}

bool Comm::TestCycle() {
  int done = 0;
  Check(MPI_Test(&cycle_, &done, MPI_STATUS_IGNORE), "MPI_Test");
  if (done) return true;
  CheckAbandoned("the negotiation cycle");
  if (abort_timeout_s_ > 0) {
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - cycle_posted_at_).count();
    // Idle peers answer every heartbeat, so silence this long means a peer is gone.
    if (waited > abort_timeout_s_) AbortUnanswered("the negotiation cycle", waited);
  }
  return false;
}

void Comm::CheckAbandoned(const char* what) const {
  if (abandon_ && abandon_->load(std::memory_order_relaxed))
    throw AbandonedError(std::string("jaxcache: gave up waiting for the other ranks in ") + what);
}

void Comm::AbortUnanswered(const char* what, double waited) {
  std::fprintf(stderr,
               "jaxcache: rank %d: no answer from the other ranks in %s for %.1f s (a rank died, "
               "hangs inside MPI, or the network failed); aborting the job "
               "(JAXCACHE_STALL_SHUTDOWN_TIME=%g)\n",
               rank_, what, waited, abort_timeout_s_);
  std::fflush(stderr);
  MPI_Abort(comm_, 70);
  std::abort();
}

void Comm::WaitWatched(MPI_Request* req, const char* what) {
  auto start = std::chrono::steady_clock::now();
  int done = 0;
  for (unsigned spins = 1;; ++spins) {
    Check(MPI_Test(req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    if (spins % 4096 == 0) {
      CheckAbandoned(what);
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > abort_timeout_s_) AbortUnanswered(what, waited);
    }
  }
}

void Comm::Allreduce(uint64_t* words, int count, MPI_Op op) {
  Check(MPI_Allreduce(MPI_IN_PLACE, words, count, MPI_UINT64_T, op, comm_), "MPI_Allreduce");
}

void Comm::AllreduceInt(int* value, MPI_Op op) {
  Check(MPI_Allreduce(MPI_IN_PLACE, value, 1, MPI_INT, op, comm_), "MPI_Allreduce");
}

void Comm::AllgatherInt(int value, int* out) {
  Check(MPI_Allgather(&value, 1, MPI_INT, out, 1, MPI_INT, comm_), "MPI_Allgather");
}

std::vector<std::vector<char>> Comm::GatherBytes(const std::vector<char>& mine) {
  int my_size = static_cast<int>(mine.size());
  std::vector<int> sizes(rank_ == 0 ? size_ : 0);
  Check(MPI_Gather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm_), "MPI_Gather");
  std::vector<int> displs;
  std::vector<char> all;
  if (rank_ == 0) {
    displs.resize(size_);
    int total = 0;
    for (int r = 0; r < size_; ++r) { displs[r] = total; total += sizes[r]; }
    all.resize(total);
  }
  Check(MPI_Gatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(), displs.data(),
                    MPI_BYTE, 0, comm_),
        "MPI_Gatherv");
  std::vector<std::vector<char>> out;
  if (rank_ == 0) {
    for (int r = 0; r < size_; ++r)
      out.emplace_back(all.begin() + displs[r], all.begin() + displs[r] + sizes[r]);
  }
  return out;
}

void Comm::BroadcastBytes(std::vector<char>* bytes) {
  int n = static_cast<int>(bytes->size());
  Check(MPI_Bcast(&n, 1, MPI_INT, 0, comm_), "MPI_Bcast");
  bytes->resize(n);
  if (n > 0) Check(MPI_Bcast(bytes->data(), n, MPI_BYTE, 0, comm_), "MPI_Bcast");
}

void Comm::AllreduceData(const void* in, void* out, int64_t count, DType dtype, ReduceOp op) {
  MPI_Datatype type = MpiDatatype(dtype);
  MPI_Op mpi_op = MpiOp(dtype, op);
  std::size_t esize = ElementSize(dtype);
  for (int64_t off = 0; off < count; off += max_count_) {
    int n = static_cast<int>(std::min(max_count_, count - off));
    char* o = static_cast<char*>(out) + off * esize;
    const void* i = in == out ? MPI_IN_PLACE : static_cast<const char*>(in) + off * esize;
    if (abort_timeout_s_ > 0) {
      MPI_Request req;
      Check(MPI_Iallreduce(i, o, n, type, mpi_op, comm_, &req), "MPI_Iallreduce");
      WaitWatched(&req, "an allreduce");
    } else {
      Check(MPI_Allreduce(i, o, n, type, mpi_op, comm_), "MPI_Allreduce");
    }
  }
}

void Comm::BroadcastData(void* buf, int64_t bytes, int root) {
  for (int64_t off = 0; off < bytes; off += max_count_) {
    int n = static_cast<int>(std::min(max_count_, bytes - off));
    char* p = static_cast<char*>(buf) + off;
    if (abort_timeout_s_ > 0) {
      MPI_Request req;
      Check(MPI_Ibcast(p, n, MPI_BYTE, root, comm_, &req), "MPI_Ibcast");
      WaitWatched(&req, "a broadcast");
    } else {
      Check(MPI_Bcast(p, n, MPI_BYTE, root, comm_), "MPI_Bcast");
    }
  }
}

void Comm::AllgatherData(const void* in, void* out, int64_t bytes_per_rank) {
  if (bytes_per_rank <= max_count_ && abort_timeout_s_ > 0) {
    MPI_Request req;
    Check(MPI_Iallgather(in, static_cast<int>(bytes_per_rank), MPI_BYTE, out,
                         static_cast<int>(bytes_per_rank), MPI_BYTE, comm_, &req),
          "MPI_Iallgather");
    WaitWatched(&req, "an allgather");
    return;
  }
  if (bytes_per_rank <= max_count_) {
    Check(MPI_Allgather(in, static_cast<int>(bytes_per_rank), MPI_BYTE, out,
                        static_cast<int>(bytes_per_rank), MPI_BYTE, comm_),
          "MPI_Allgather");
    return;
  }
  // Large blocks: one broadcast per rank, chunked.
  for (int r = 0; r < size_; ++r) {
    char* block = static_cast<char*>(out) + r * bytes_per_rank;
    if (r == rank_ && block != in) std::copy_n(static_cast<const char*>(in), bytes_per_rank, block);
    BroadcastData(block, bytes_per_rank, r);
  }
}

}  // namespace jaxcache
