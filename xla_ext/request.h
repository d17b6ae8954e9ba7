// A request is one named collective submitted by one rank: the signature that
// must agree across ranks plus this rank's buffers and its completion.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
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

struct Request {
  std::string name;
  uint64_t seq = 0;  // this rank's submission number of `name` (set by RequestTable)
  Signature sig;
  std::vector<const void*> inputs;  // one per tensor in sig.tensors
  std::vector<void*> outputs;       // may alias inputs (in-place)
  Completion done;
  // Refuse at once (kDuplicate) instead of queueing when `name` is in flight
  // on this rank: Horovod's semantics for explicitly named eager requests.
  bool refuse_if_in_flight = false;
  Clock::time_point submitted = Clock::now();
};

using RequestPtr = std::unique_ptr<Request>;

// What rank 0 decides for one name, broadcast to every rank in list order.
struct Response {
  std::string name;
  uint64_t seq = 0;
  Status status;  // error responses fail the request on every rank
  Signature sig;  // the agreed signature (for the cache)
};

}  // namespace jaxcache
