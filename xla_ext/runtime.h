// The per-process engine: a background thread that owns every MPI call and
// runs negotiation cycles, plus a completion thread. Requests arrive from any
// thread through Submit().
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "comm.h"
#include "config.h"
#include "controller.h"
#include "operations.h"
#include "tensor_queue.h"
#include "timeline.h"

namespace jaxcache {

class Runtime {
 public:
  // Starts the process's runtime over a duplicate of `comm` (collective).
  // Throws std::runtime_error when the ranks' settings differ.
  static void Start(MPI_Comm comm, const Config& config);
  // Shuts down this process's runtime (waits at most `timeout_s` for the
  // other ranks to acknowledge).
  static void Stop(double timeout_s);
  // The running runtime, or null.
  static std::shared_ptr<Runtime> Current();

  ~Runtime();
  // Queues a request. Errors (duplicate name, shut down) come back at once
  // and the request's callback is not called.
  Status Submit(RequestPtr req);

  const Comm& comm() const { return *comm_; }
  Stats& stats() { return stats_; }
  std::unordered_map<std::string, uint32_t> CacheLayout() const { return controller_->CacheLayout(); }
  bool running() const { return !queue_.closed(); }

 private:
  Runtime(MPI_Comm comm, const Config& config);
  void CheckConsistentConfig();
  void Loop();
  void WaitBetweenPolls(std::chrono::microseconds* backoff, std::chrono::microseconds max);
  void Complete(RequestPtr req, Status status);

  Config config_;
  Stats stats_;
  Timeline timeline_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Operations> operations_;
  TensorQueue queue_;
  CompletionQueue completions_;
  std::atomic<bool> want_shutdown_{false};
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool loop_done_ = false;
  std::thread thread_;
};

}  // namespace jaxcache
