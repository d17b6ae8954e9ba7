// A request is one named collective submitted by one rank: the signature that
// must agree across ranks plus this rank's buffers and completion callback.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common.h"

namespace jaxcache {

using Clock = std::chrono::steady_clock;

struct Request {
  std::string name;
  Signature sig;
  std::vector<const void*> inputs;  // one per tensor in sig.tensors
  std::vector<void*> outputs;       // may alias inputs (in-place)
  // Called exactly once: from the completion thread, or directly from the
  // background thread when `cheap_done` (it only wakes a waiter; saves a hop).
  std::function<void(const Status&)> done;
  bool cheap_done = false;
  Clock::time_point submitted = Clock::now();
};

using RequestPtr = std::unique_ptr<Request>;

// What rank 0 decides for one name, broadcast to every rank in list order.
struct Response {
  std::string name;
  Status status;      // error responses fail the request on every rank
  Signature sig;      // the agreed signature (for the cache)
};

}  // namespace jaxcache
