// Runs completion callbacks on a thread of their own: XLA resumes dependent
// work on the thread that completes a future, which must not be the MPI thread.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "request.h"

namespace jaxcache {

class CompletionQueue {
 public:
  CompletionQueue();
  ~CompletionQueue();  // runs what is queued, then stops
  void Push(RequestPtr req, Status status);
  // A completion without a request (point-to-point ops).
  void Push(Completion done, Status status);

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<RequestPtr, Status>> items_;
  std::vector<std::pair<Completion, Status>> bare_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace jaxcache
