// The per-process engine: a background thread that owns every MPI call and
// runs negotiation cycles, the request table that owns every request, and a
// completion thread. Requests arrive from any thread through Submit().
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm.h"
#include "completion_queue.h"
#include "config.h"
#include "controller.h"
#include "fault_injection.h"
#include "operations.h"
#include "request_table.h"
#include "timeline.h"

namespace jaxcache {

class Runtime {
 public:
  // Starts the process's runtime over a duplicate of `comm` (collective).
  // `config` must be the same on every rank (the Python layer broadcasts
  // rank 0's). Throws std::invalid_argument for a bad fault-injection spec.
  static void Start(MPI_Comm comm, const Config& config);
  // Collective shutdown: waits up to `timeout_s` until every rank has called
  // it, then stops the runtime on every rank that still answers. Returns ""
  // or, when it had to stop without some ranks, what happened.
  static std::string Stop(double timeout_s);
  // The running (or last) runtime, or null.
  static std::shared_ptr<Runtime> Current();

  ~Runtime();
  // Takes ownership; the outcome, refusals included, arrives through req->done.
  void Submit(RequestPtr req) { table_.Admit(std::move(req)); }

  const Comm& comm() const { return *comm_; }
  Stats& stats() { return stats_; }
  std::unordered_map<std::string, uint32_t> CacheLayout() const { return controller_->CacheLayout(); }
  bool running() const { return !table_.closed(); }

 private:
  Runtime(MPI_Comm comm, const Config& config);
  void Loop();
  void Complete(Request* req, const Status& status);
  // Waits for the loop to end; true if it did within `seconds`.
  bool WaitDone(double seconds);

  Config config_;
  Stats stats_;
  Timeline timeline_;
  std::unique_ptr<Comm> comm_;
  FaultInjector faults_;
  CompletionQueue completions_;
  RequestTable table_{completions_};
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Operations> operations_;
  std::atomic<bool> shutdown_requested_{false}, shutdown_forced_{false}, abandon_{false};
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool loop_done_ = false;
  std::string closing_message_;  // why the loop ended (under done_mu_)
  std::thread thread_;
};

}  // namespace jaxcache
