// The inbox between submitting threads (XLA, Python, bridges) and the
// background thread. Rejects duplicate in-flight names and submissions after
// shutdown at once, on the caller's thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "request.h"

namespace jaxcache {

class TensorQueue {
 public:
  // On error the request is returned untouched in `*rejected` status.
  Status Push(RequestPtr* req);
  std::vector<RequestPtr> Drain();
  // The name may be submitted again.
  void Finish(const std::string& name);
  // Waits until new requests arrive, the queue is woken, or `timeout` passes.
  // Returns true when there is new work.
  bool WaitFor(std::chrono::microseconds timeout);
  void Wake();
  void Close(Status why);
  bool closed() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RequestPtr> incoming_;
  std::unordered_set<std::string> in_flight_;
  bool closed_ = false;
  bool woken_ = false;
  Status closed_status_;
};

// Runs completion callbacks on its own thread: XLA resumes dependent work on
// the thread that completes a future, which must not be the MPI thread.
class CompletionQueue {
 public:
  CompletionQueue();
  ~CompletionQueue();
  void Push(RequestPtr req, Status status);

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<RequestPtr, Status>> items_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace jaxcache
