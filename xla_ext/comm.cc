#include "comm.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

#include "reduce_ops.h"

namespace jaxcache {

void CheckMpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string("jaxcache: ") + what + " failed: " + std::string(msg, len));
}

Comm::Comm(MPI_Comm user_comm, int64_t max_count, int64_t chunk_bytes)
    : max_count_(std::max<int64_t>(1, std::min<int64_t>(max_count, INT_MAX))),
      chunk_bytes_(chunk_bytes) {
  CheckMpi(MPI_Comm_dup(user_comm, &comm_), "MPI_Comm_dup");
  // Errors come back as codes so the runtime can report them instead of aborting.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Comm local;
  CheckMpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
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

namespace {
// Tests the requests; an error completes them (the caller rethrows it where the
// step that started them can handle it) and is returned in `*error`.
bool TestAll(int n, MPI_Request* reqs, MPI_Status* statuses, std::string* error) {
  int done = 0;
  int rc = MPI_Testall(n, reqs, &done, statuses);
  if (rc == MPI_SUCCESS) return done != 0;
  try {
    CheckMpi(rc, "completing an MPI call");
  } catch (const std::exception& e) {
    *error = e.what();
  }
  for (int i = 0; i < n; ++i)
    if (reqs[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[i]);
  return true;
}
}  // namespace

bool Comm::Parked::await_ready() { return TestAll(n, comm.reqs_, comm.statuses_, &comm.completion_error_); }

void Comm::Parked::await_resume() {
  if (comm.completion_error_.empty()) return;
  throw std::runtime_error(std::exchange(comm.completion_error_, std::string()));
}

void Comm::Parked::await_suspend(std::coroutine_handle<> h) {
  comm.waiter_ = h;
  comm.parked_n_ = n;
  comm.parked_what_ = what;
  comm.parked_on_ = wait;
  comm.parked_at_ = std::chrono::steady_clock::now();
}

bool Comm::Poll() {
  if (!waiter_) return false;
  if (!TestAll(parked_n_, reqs_, statuses_, &completion_error_)) {
    CheckAbandoned(parked_what_);
    if (abort_timeout_s_ > 0) {
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - parked_at_).count();
      // Idle peers answer every heartbeat, so silence this long means a peer is gone.
      if (waited > abort_timeout_s_) AbortUnanswered(parked_what_, waited);
    }
    return false;
  }
  auto h = std::exchange(waiter_, nullptr);
  parked_n_ = 0;
  h.resume();
  return true;
}

void Comm::CheckAbandoned(const char* what) const {
  if (abandon_ && abandon_->load(std::memory_order_relaxed))
    throw AbandonedError(std::string("jaxcache: gave up waiting for the other ranks in ") + what);
}

void Comm::AbortUnanswered(const char* what, double waited) {
  std::fprintf(stderr,
               "jaxcache: rank %d: no answer from the other ranks in %s for %.1f s (a rank died, "
               "hangs inside MPI, or the network failed); aborting the job (the wait "
               "JAXCACHE_STALL_SHUTDOWN_TIME=S allows: max(2 S, S + 5) = %g s)\n",
               rank_, what, waited, abort_timeout_s_);
  std::fflush(stderr);
  AbortJob(comm_, 70);
}

void AbortJob(MPI_Comm comm, int code) {
  ExitAbortsOnThisThread();  // MPI_Abort calls exit() on this thread
  MPI_Abort(comm, code);
  std::abort();  // this MPICH's MPI_Abort can return
}

// Recursive doubling over point-to-point messages rather than MPI_Iallreduce:
// the cycle's allreduce is on the path of every collective, and MPICH's
// nonblocking allreduce, with its per-call schedule, took several times as
// long as an exchange of the same bytes (benchmarks/README.md, "Figures behind the runtime's comments").
// Each combination is (lower ranks' part) op (higher ranks' part), so every
// rank evaluates the same expression tree: bitwise the same result everywhere,
// even for an operator that is not exactly commutative (a NaN in min/max).
// Ranks beyond the largest power of two first fold into a neighbour, which
// hands them the result at the end.
Task<> Comm::CycleAllreduce(char* msg, std::size_t* bytes, std::size_t max_bytes,
                            const CycleCombine& combine) {
  if (size_ == 1) co_return;
  cycle_scratch_.resize(max_bytes);
  char* theirs = cycle_scratch_.data();
  std::size_t received = 0;
  auto combine_with = [&](int peer) { *bytes = combine(msg, *bytes, theirs, received, peer < rank_); };
  int pof2 = 1;
  while (pof2 * 2 <= size_) pof2 *= 2;
  const int folded = 2 * (size_ - pof2);  // ranks below this pair up first
  const bool folds_away = rank_ < folded && rank_ % 2 == 0;
  if (folds_away) {
    co_await CycleStep(msg, *bytes, rank_ + 1, nullptr, 0, -1, &received);
  } else {
    if (rank_ < folded) {
      co_await CycleStep(nullptr, 0, -1, theirs, max_bytes, rank_ - 1, &received);
      combine_with(rank_ - 1);
    }
    // Position among the ranks left: a folded pair counts once.
    const int position = rank_ < folded ? rank_ / 2 : rank_ - folded / 2;
    for (int mask = 1; mask < pof2; mask <<= 1) {
      const int other = position ^ mask;
      const int peer = other < folded / 2 ? 2 * other + 1 : other + folded / 2;
      co_await CycleStep(msg, *bytes, peer, theirs, max_bytes, peer, &received);
      combine_with(peer);
    }
  }
  if (rank_ < folded) {
    if (folds_away) {
      co_await CycleStep(nullptr, 0, -1, msg, max_bytes, rank_ + 1, &received);
      *bytes = received;
    } else {
      co_await CycleStep(msg, *bytes, rank_ - 1, nullptr, 0, -1, &received);
    }
  }
}

Task<> Comm::CycleStep(const void* send, std::size_t send_bytes, int to, void* recv,
                       std::size_t recv_max, int from, std::size_t* received) {
  int n = 0;
  if (recv)  // first, so that its status is statuses_[0]
    CheckMpi(MPI_Irecv(recv, static_cast<int>(recv_max), MPI_BYTE, from, kCycleTag, comm_, &reqs_[n++]),
          "MPI_Irecv");
  if (send)
    CheckMpi(MPI_Isend(send, static_cast<int>(send_bytes), MPI_BYTE, to, kCycleTag, comm_, &reqs_[n++]),
          "MPI_Isend");
  co_await Await(n, "the negotiation cycle", Wait::kArrival);
  if (recv) {
    int count = 0;
    CheckMpi(MPI_Get_count(&statuses_[0], MPI_BYTE, &count), "MPI_Get_count");
    *received = static_cast<std::size_t>(count);
  }
}

Task<> Comm::Allreduce(uint64_t* words, int count, MPI_Op op) {
  co_await Run("MPI_Iallreduce", [&](MPI_Request* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, words, count, MPI_UINT64_T, op, comm_, r);
  });
}

Task<> Comm::AllreduceInt(int* value, MPI_Op op) {
  co_await Run("MPI_Iallreduce", [&](MPI_Request* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, value, 1, MPI_INT, op, comm_, r);
  });
}

Task<> Comm::AllgatherInt(int value, int* out) {
  co_await Run("MPI_Iallgather", [&](MPI_Request* r) {
    return MPI_Iallgather(&value, 1, MPI_INT, out, 1, MPI_INT, comm_, r);
  });
}

Task<std::vector<std::vector<char>>> Comm::GatherBytes(const std::vector<char>& mine) {
  int my_size = static_cast<int>(mine.size());
  std::vector<int> sizes(rank_ == 0 ? size_ : 0);
  co_await Run("MPI_Igather", [&](MPI_Request* r) {
    return MPI_Igather(&my_size, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, comm_, r);
  });
  std::vector<int> displs;
  std::vector<char> all;
  if (rank_ == 0) {
    displs.resize(size_);
    int total = 0;
    for (int q = 0; q < size_; ++q) { displs[q] = total; total += sizes[q]; }
    all.resize(total);
  }
  co_await Run("MPI_Igatherv", [&](MPI_Request* r) {
    return MPI_Igatherv(mine.data(), my_size, MPI_BYTE, all.data(), sizes.data(), displs.data(),
                        MPI_BYTE, 0, comm_, r);
  });
  std::vector<std::vector<char>> out;
  if (rank_ == 0) {
    for (int q = 0; q < size_; ++q)
      out.emplace_back(all.begin() + displs[q], all.begin() + displs[q] + sizes[q]);
  }
  co_return out;
}

Task<> Comm::BroadcastBytes(std::vector<char>* bytes) {
  int n = static_cast<int>(bytes->size());
  co_await Run("MPI_Ibcast", [&](MPI_Request* r) { return MPI_Ibcast(&n, 1, MPI_INT, 0, comm_, r); });
  bytes->resize(n);
  if (n > 0)
    co_await Run("MPI_Ibcast", [&](MPI_Request* r) {
      return MPI_Ibcast(bytes->data(), n, MPI_BYTE, 0, comm_, r);
    });
}

Task<> Comm::AllreduceData(const void* in, void* out, int64_t count, DType dtype, ReduceOp op) {
  MPI_Datatype type = MpiDatatype(dtype);
  MPI_Op mpi_op = MpiOp(dtype, Reduction(op));
  std::size_t esize = ElementSize(dtype);
  const int64_t step = ChunkCount(esize);
  for (int64_t off = 0; off < count; off += step) {
    int n = static_cast<int>(std::min(step, count - off));
    char* o = static_cast<char*>(out) + off * esize;
    const void* i = in == out ? MPI_IN_PLACE : static_cast<const char*>(in) + off * esize;
    co_await Run("MPI_Iallreduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(i, o, n, type, mpi_op, comm_, r);
    });
  }
}

Task<> Comm::BroadcastData(void* buf, int64_t bytes, int root) {
  const int64_t step = ChunkCount(1);
  for (int64_t off = 0; off < bytes; off += step) {
    int n = static_cast<int>(std::min(step, bytes - off));
    char* p = static_cast<char*>(buf) + off;
    co_await Run("MPI_Ibcast", [&](MPI_Request* r) { return MPI_Ibcast(p, n, MPI_BYTE, root, comm_, r); });
  }
}

Task<> Comm::AllgatherData(const void* in, void* out, int64_t bytes_per_rank) {
  if (bytes_per_rank <= max_count_) {
    const int n = static_cast<int>(bytes_per_rank);
    co_await Run("MPI_Iallgather", [&](MPI_Request* r) {
      return MPI_Iallgather(in, n, MPI_BYTE, out, n, MPI_BYTE, comm_, r);
    });
    co_return;
  }
  // Large blocks: one broadcast per rank, chunked.
  for (int q = 0; q < size_; ++q) {
    char* block = static_cast<char*>(out) + q * bytes_per_rank;
    if (q == rank_ && block != in) std::copy_n(static_cast<const char*>(in), bytes_per_rank, block);
    co_await BroadcastData(block, bytes_per_rank, q);
  }
}

namespace {
// A valid address for a send of zero bytes (a joined rank's allgather input).
char empty_send = 0;

std::vector<int> IntCounts(const std::vector<int64_t>& counts, std::vector<int>* displs) {
  std::vector<int> out(counts.size());
  int64_t off = 0;
  displs->assign(counts.size(), 0);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    out[i] = static_cast<int>(counts[i]);
    (*displs)[i] = static_cast<int>(off);
    off += counts[i];
  }
  return out;
}

int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

bool AllEqual(const std::vector<int64_t>& v) {
  return std::all_of(v.begin(), v.end(), [&](int64_t x) { return x == v[0]; });
}
}  // namespace

Task<> Comm::AllgathervData(const void* in, void* out, const std::vector<int64_t>& bytes) {
  if (!in) in = &empty_send;
  if (Sum(bytes) <= max_count_) {
    std::vector<int> displs;
    std::vector<int> counts = IntCounts(bytes, &displs);
    co_await Run("MPI_Iallgatherv", [&](MPI_Request* r) {
      return MPI_Iallgatherv(in, counts[rank_], MPI_BYTE, out, counts.data(), displs.data(),
                             MPI_BYTE, comm_, r);
    });
    co_return;
  }
  // Large: one chunked broadcast per rank.
  int64_t off = 0;
  for (int q = 0; q < size_; ++q) {
    char* block = static_cast<char*>(out) + off;
    if (q == rank_ && bytes[q] > 0) std::copy_n(static_cast<const char*>(in), bytes[q], block);
    co_await BroadcastData(block, bytes[q], q);
    off += bytes[q];
  }
}

Task<> Comm::ReducescatterData(const void* in, void* out, const std::vector<int64_t>& counts,
                               DType dtype, ReduceOp op) {
  MPI_Datatype type = MpiDatatype(dtype);
  MPI_Op mpi_op = MpiOp(dtype, Reduction(op));
  if (Sum(counts) <= max_count_) {
    if (AllEqual(counts)) {
      const int n = static_cast<int>(counts[0]);
      co_await Run("MPI_Ireduce_scatter_block", [&](MPI_Request* r) {
        return MPI_Ireduce_scatter_block(in, out, n, type, mpi_op, comm_, r);
      });
    } else {
      std::vector<int> displs;
      std::vector<int> c = IntCounts(counts, &displs);
      co_await Run("MPI_Ireduce_scatter", [&](MPI_Request* r) {
        return MPI_Ireduce_scatter(in, out, c.data(), type, mpi_op, comm_, r);
      });
    }
    co_return;
  }
  // Large: each rank's block reduced to it, in chunks.
  const std::size_t esize = ElementSize(dtype);
  int64_t block = 0;
  for (int q = 0; q < size_; ++q) {
    for (int64_t off = 0; off < counts[q]; off += max_count_) {
      const int n = static_cast<int>(std::min(max_count_, counts[q] - off));
      const char* i = static_cast<const char*>(in) + (block + off) * esize;
      char* o = q == rank_ ? static_cast<char*>(out) + off * esize : nullptr;
      co_await Run("MPI_Ireduce", [&](MPI_Request* r) {
        return MPI_Ireduce(i, o, n, type, mpi_op, q, comm_, r);
      });
    }
    block += counts[q];
  }
}

Task<> Comm::AlltoallData(const void* in, void* out, const std::vector<int64_t>& bytes) {
  // Every choice below is made from `bytes`, which every rank holds alike: a rank deciding
  // from its own counts alone (all zero on a rank that sends and receives nothing) would call
  // MPI_Ialltoall where the others call MPI_Ialltoallv, and the job would hang.
  char nothing = 0;
  if (!in) in = &empty_send;
  if (!out) out = &nothing;  // (this rank receives no rows)
  std::vector<int64_t> send(size_), recv(size_);
  int64_t largest = 0, busiest = 0;
  for (int s = 0; s < size_; ++s) {
    int64_t sent = 0, received = 0;
    for (int d = 0; d < size_; ++d) {
      const int64_t n = bytes[static_cast<std::size_t>(s) * size_ + d];
      sent += n;
      received += bytes[static_cast<std::size_t>(d) * size_ + s];
      largest = std::max(largest, n);
      if (s == rank_) send[d] = n;
      if (d == rank_) recv[s] = n;
    }
    busiest = std::max({busiest, sent, received});
  }
  if (busiest <= max_count_) {
    if (AllEqual(bytes)) {
      const int n = static_cast<int>(bytes[0]);
      co_await Run("MPI_Ialltoall", [&](MPI_Request* r) {
        return MPI_Ialltoall(in, n, MPI_BYTE, out, n, MPI_BYTE, comm_, r);
      });
      co_return;
    }
    std::vector<int> sdispls, rdispls;
    std::vector<int> scounts = IntCounts(send, &sdispls), rcounts = IntCounts(recv, &rdispls);
    co_await Run("MPI_Ialltoallv", [&](MPI_Request* r) {
      return MPI_Ialltoallv(in, scounts.data(), sdispls.data(), MPI_BYTE, out, rcounts.data(),
                            rdispls.data(), MPI_BYTE, comm_, r);
    });
    co_return;
  }
  // Large: pairwise exchanges in rounds, in chunks of at most max_count bytes.
  // Every rank runs as many chunks as the largest pair needs; a pair's empty
  // chunks are skipped on both sides, so each send meets its receive.
  std::vector<int64_t> soff(size_, 0), roff(size_, 0);
  for (int q = 1; q < size_; ++q) {
    soff[q] = soff[q - 1] + send[q - 1];
    roff[q] = roff[q - 1] + recv[q - 1];
  }
  const int64_t chunks = (largest + max_count_ - 1) / max_count_;
  auto part = [&](int64_t total, int64_t c) { return std::clamp<int64_t>(total - c * max_count_, 0, max_count_); };
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (int k = 0; k < size_; ++k) {
    const int to = (rank_ + k) % size_, from = (rank_ - k + size_) % size_;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t at = c * max_count_;
      const int sn = static_cast<int>(part(send[to], c)), rn = static_cast<int>(part(recv[from], c));
      if (k == 0) {
        if (sn > 0) std::copy_n(src + soff[to] + at, sn, dst + roff[from] + at);
        continue;
      }
      co_await Exchange(src + soff[to] + at, sn, to, dst + roff[from] + at, rn, from, DType::kUInt8,
                        "an alltoall");
    }
  }
}

int Comm::PostExchange(const void* send, int64_t send_count, int to, void* recv, int64_t recv_count, int from,
                       DType dtype) {
  MPI_Datatype type = MpiDatatype(dtype);
  int n = 0;
  if (recv_count > 0)
    CheckMpi(MPI_Irecv(recv, static_cast<int>(recv_count), type, from, 0, comm_, &reqs_[n++]), "MPI_Irecv");
  if (send_count > 0)
    CheckMpi(MPI_Isend(send, static_cast<int>(send_count), type, to, 0, comm_, &reqs_[n++]), "MPI_Isend");
  return n;
}

Task<> Comm::Exchange(const void* send, int64_t send_count, int to, void* recv, int64_t recv_count,
                      int from, DType dtype, const char* what) {
  const int n = PostExchange(send, send_count, to, recv, recv_count, from, dtype);
  if (n > 0) co_await Await(n, what);
}

}  // namespace jaxcache
