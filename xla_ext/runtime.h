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

// Requests up to this size are driven by their submitter (Runtime::Submit);
// larger ones are left to the background thread, so an XLA thread never
// spends long on data movement that could overlap its computation.
constexpr std::size_t kInlineBytes = 1 << 20;

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
  // With `drive`, when no other thread is driving the runtime, the caller runs
  // cycles itself for up to JAXCACHE_INLINE_SPIN_US: a request whose peers are
  // ready completes on the calling thread, with no thread hand-off at all
  // (docs/control_plane.md, "Who drives the cycles").
  void Submit(RequestPtr req, bool drive = false);

  const Comm& comm() const { return *comm_; }
  Stats& stats() { return stats_; }
  std::unordered_map<std::string, uint32_t> CacheLayout() const { return controller_->CacheLayout(); }
  bool running() const { return !table_.closed(); }

 private:
  Runtime(MPI_Comm comm, const Config& config);
  void Loop();
  // Requires driver_mu_: begins a cycle unless one is posted, tests it and, if
  // every rank has joined, finishes it and runs its outcome. True if a cycle
  // finished.
  bool Advance();
  void RunOutcome(CycleOutcome& out);
  // A failure outside every fault-handling step: ends the job (see runtime.cc).
  [[noreturn]] void Fatal(const std::exception& e);
  void Complete(Request* req, const Status& status);
  // Waits for the loop to end; true if it did within `seconds`.
  bool WaitDone(double seconds);

  Config config_;
  Stats stats_;
  Timeline timeline_;
  std::unique_ptr<Comm> comm_;
  FaultInjector faults_;
  Status closing_;  // why the loop ends (under driver_mu_)
  CompletionQueue completions_;
  RequestTable table_{completions_};
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Operations> operations_;
  std::atomic<bool> shutdown_requested_{false}, shutdown_forced_{false}, abandon_{false};
  // Held by whichever thread drives cycles: the background thread, or a
  // submitter running its own request inline.
  std::mutex driver_mu_;
  bool progress_ = true;                 // under driver_mu_: the last cycle decided something
  std::atomic<bool> stop_loop_{false};  // a cycle decided to shut down (or was abandoned)
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool loop_done_ = false;
  std::string closing_message_;  // why the loop ended (under done_mu_)
  std::thread thread_;
};

}  // namespace jaxcache
