// A request is one named collective submitted by one rank: the signature that
// must agree across ranks plus this rank's buffers and its completion.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "common.h"

namespace jaxcache {

using Clock = std::chrono::steady_clock;

// The one way a request's outcome reaches its submitter, run exactly once.
// A Completion destroyed before it ran completes with an internal error, so a
// request lost on any path (an exception, a forgotten list) fails loudly
// instead of leaving an XLA future or an eager waiter pending forever.
class Completion {
 public:
  using Fn = std::function<void(const Status&)>;
  Completion() = default;
  // `cheap`: the callback only wakes a waiter, so the background thread may
  // run it directly instead of handing it to the completion thread.
  Completion(Fn fn, bool cheap) : fn_(std::move(fn)), cheap_(cheap) {}
  Completion(Completion&& o) noexcept : fn_(std::move(o.fn_)), cheap_(o.cheap_) { o.fn_ = nullptr; }
  Completion& operator=(Completion&& o) noexcept;
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
  ~Completion();

  void Run(const Status& status);
  bool pending() const { return static_cast<bool>(fn_); }
  bool cheap() const { return cheap_; }

 private:
  Fn fn_;
  bool cheap_ = false;
};

// What the ranks agreed beyond the signature, decided by rank 0 from every
// rank's request and sent to every rank with the response (cached with it):
//  - allgather: per tensor t and rank r, rows[t * size + r] = rank r's first
//    dimension of tensor t;
//  - alltoall: rows[s * size + d] = rows rank s sends to rank d.
// Ranks that have joined contribute no rows.
struct Agreement {
  std::vector<int64_t> rows;
  bool static_shapes = false;  // some rank's outputs are sized for equal shapes
};

// Outputs whose size is known only once the ranks have agreed (an eager
// allgather with a different first dimension per rank, an alltoall): the
// executor allocates them; the submitter reads them after completion.
struct OutputStore {
  struct Buffer {
    std::unique_ptr<char, void (*)(void*)> data{nullptr, &std::free};
    std::size_t bytes = 0;
    std::vector<int64_t> shape;
  };
  std::vector<Buffer> buffers;  // one per tensor
  // allgather: the first dimension of each tensor on each rank (t * size + r);
  // alltoall: the rows received from each rank.
  std::vector<int64_t> rows;
  // allgather: the ranks that contributed (not joined); what an average of
  // gathered sparse values divides by.
  int32_t contributors = 0;
  // Allocates `bytes` (uninitialized: every byte is written by MPI), at least
  // 64-byte aligned (any dtype, vector loads); never null, even for 0 bytes.
  static Buffer Allocate(std::size_t bytes, std::vector<int64_t> shape) {
    Buffer b;
    b.bytes = bytes;
    b.shape = std::move(shape);
    // Large buffers start on a 2 MiB boundary, so that all of them can be huge pages.
    const std::size_t align = bytes >= (4u << 20) ? (2u << 20) : 64;
    void* p = std::aligned_alloc(align, std::max(align, (bytes + align - 1) / align * align));
    if (!p) throw std::bad_alloc();
    b.data.reset(static_cast<char*>(p));
    return b;
  }
};

// Where a request stands in its RequestTable (the only one that changes it, under its
// lock): queued behind an earlier submission of its name, active (its name's turn),
// or taken by the driver that negotiates and executes it. A completed request is no
// longer in the table (its completion has run or is queued to run).
enum class RequestState : uint8_t { kQueued, kActive, kTaken };

inline const char* RequestStateName(RequestState s) {
  switch (s) {
    case RequestState::kQueued: return "queued";
    case RequestState::kActive: return "active";
    case RequestState::kTaken: return "taken";
  }
  return "?";
}

struct Request {
  std::string name;
  RequestState state = RequestState::kQueued;  // set by RequestTable
  uint64_t seq = 0;  // this rank's submission number of `name` (set by RequestTable)
  Signature sig;
  std::vector<const void*> inputs;  // one per tensor in sig.tensors
  std::vector<void*> outputs;       // may alias inputs (in-place)
  Completion done;
  // Refuse at once (kDuplicate) instead of queueing when `name` is in flight
  // on this rank: Horovod's semantics for explicitly named eager requests.
  bool refuse_if_in_flight = false;
  // The process set whose ranks take part (0: every rank); names are matched
  // within the set.
  int32_t process_set = 0;
  Clock::time_point submitted = Clock::now();

  // Set when the request is decided (see Controller):
  std::shared_ptr<const Agreement> agreement;  // allgather, alltoall
  int32_t contributors = 0;  // ranks whose data counts (not joined); 0 = every rank
  // Set at submission when the executor allocates the outputs.
  std::shared_ptr<OutputStore> store;
};

using RequestPtr = std::unique_ptr<Request>;

// What rank 0 decides for one name, broadcast to every rank in list order.
struct Response {
  std::string name;
  uint64_t seq = 0;
  Status status;  // error responses fail the request on every rank
  Signature sig;  // the agreed signature (for the cache)
  std::shared_ptr<const Agreement> agreement;  // allgather, alltoall
};

}  // namespace jaxcache
