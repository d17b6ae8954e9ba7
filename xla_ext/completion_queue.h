// Runs completion callbacks on a thread of their own: XLA resumes dependent
// work on the thread that completes a future, which must not be the MPI thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
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
  // `wakeups` (optional) counts the wake-ups of the completion thread this push causes.
  void Push(RequestPtr req, Status status, std::atomic<int64_t>* wakeups = nullptr);
  // A completion without a request (point-to-point ops).
  void Push(Completion done, Status status);

  // While a Batch lives on a thread, that thread's pushes to `queue` wake its
  // thread once, when the batch ends: a cycle that completes many requests
  // hands them over together. One wake-up per request (the completion thread
  // sleeping between them) was most of a jitted step of 1000 concurrent small
  // allreduces where ranks outnumber cores (benchmarks/README.md, "Figures behind the runtime's comments").
  class Batch {
   public:
    explicit Batch(CompletionQueue& queue);
    ~Batch();
    Batch(const Batch&) = delete;
    Batch& operator=(const Batch&) = delete;

   private:
    friend class CompletionQueue;
    CompletionQueue& queue_;
    Batch* outer_;
    bool pushed_ = false;
    std::atomic<int64_t>* wakeups_ = nullptr;
  };

 private:
  void Loop();
  // Under mu_: wakes the thread now, or when this thread's batch ends.
  void WakeLocked(std::atomic<int64_t>* wakeups);
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<RequestPtr, Status>> items_;
  std::vector<std::pair<Completion, Status>> bare_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace jaxcache
