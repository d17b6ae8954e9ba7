// The per-process engine: the process sets (set 0 is the whole job), one
// background thread that drives every set's cycles, and a completion thread.
// Requests arrive from any thread through Submit(); a submitter may drive its
// own set's cycles for a short while (inline driving).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "completion_queue.h"
#include "config.h"
#include "fault_injection.h"
#include "pacing.h"
#include "point_to_point.h"
#include "process_set.h"
#include "request_table.h"
#include "timeline.h"

namespace jaxcache {

// Requests up to this size are driven by their submitter (Runtime::Submit);
// larger ones are left to the background thread, so an XLA thread never
// spends long on data movement that could overlap its computation (at most
// JAXCACHE_INLINE_SPIN_US + kInlineTransferGrace). Up to 4 MiB, driving the
// data inline was still faster than handing it over (benchmarks/README.md, "Figures behind the runtime's comments").
constexpr std::size_t kInlineBytes = std::size_t(4) << 20;

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
  // With `drive`, when no other thread is driving the request's process set,
  // the caller runs its cycles for up to JAXCACHE_INLINE_SPIN_US: a request
  // whose peers are ready completes on the calling thread, with no thread
  // hand-off at all (docs/control_plane.md, "Who drives the cycles").
  void Submit(RequestPtr req, bool drive = false);
  // A waiter's turn to drive: when no other thread drives process set `set_id`,
  // runs its cycles until `done()` holds or JAXCACHE_INLINE_SPIN_US passes (an
  // async request submitted without driving is then driven by whoever waits).
  void DriveUntil(int32_t set_id, const std::function<bool()>& done);

  // Registers process set `id` over a duplicate of `comm` (collective over its
  // members; only members call it). Throws if the id is taken.
  void AddProcessSet(int32_t id, MPI_Comm comm);
  // Collective over the set's members: stops it once every member asked (or
  // after `timeout_s`, without the others), failing what is pending in it.
  // Returns "" or what went wrong.
  std::string RemoveProcessSet(int32_t id, double timeout_s);
  // The set, or null if this rank is not a member (or it was removed).
  std::shared_ptr<ProcessSet> Set(int32_t id) const;
  // The ids of the sets this rank is a member of.
  std::vector<int32_t> SetIds() const;

  // The timeline, started or stopped while the runtime runs. Only the job's
  // rank 0 writes one; on the others these do nothing. Returns "" or why the
  // file could not be created.
  std::string StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline();

  const Comm& comm() const { return global_->comm(); }
  // The settings every rank runs with (rank 0's).
  const Config& config() const { return config_; }
  // Sends and receives (point_to_point.h).
  PointToPoint& p2p() { return p2p_; }
  bool running() const { return !global_->table().closed(); }

 private:
  Runtime(MPI_Comm comm, const Config& config);
  void Loop();
  // The loop's steps: one pass over the sets, one set, and the pause after a pass.
  Sweep SweepSets(const Pacing& pacing);
  void VisitSet(ProcessSet& set, Clock::time_point now, bool stopping, const Pacing& pacing, Sweep* sweep);
  CycleTiming TimingOf(ProcessSet& set, Clock::time_point now, bool stopping, const Pacing& pacing);
  void Pause(const Sweep& sweep, Pacing& pacing, uint64_t* seen);
  // The sets as they are now (the loop works on a snapshot).
  std::vector<std::shared_ptr<ProcessSet>> Sets() const;
  CycleIntent IntentFor(const ProcessSet& set) const;
  // Runs `set`'s cycles on this thread (its driver lock held) until `done()`,
  // the set stops, or the spin time passes; then hands over to the background thread.
  void Drive(ProcessSet& set, std::unique_lock<std::mutex>& lock, const std::function<bool()>& done);
  // A failure outside every fault-handling step: ends the job (see runtime.cc).
  [[noreturn]] void Fatal(const std::exception& e);
  // Waits until `done()` holds or `seconds` pass (done_cv_ is notified whenever a set stops).
  template <typename Pred>
  bool WaitUntil(double seconds, Pred done);

  Config config_;
  Timeline timeline_;
  std::unique_ptr<FaultInjector> faults_;
  std::atomic<bool> shutdown_requested_{false}, shutdown_forced_{false}, abandon_{false};
  Wakeup wakeup_;
  CompletionQueue completions_;
  PointToPoint p2p_{config_, completions_};
  mutable std::mutex sets_mu_;
  std::map<int32_t, std::shared_ptr<ProcessSet>> sets_;
  std::shared_ptr<ProcessSet> global_;
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool loop_done_ = false;
  std::string closing_message_;  // why the loop ended (under done_mu_)
  std::thread thread_;
  // How long an inline driver polls before yielding between polls (runtime.cc).
  std::chrono::microseconds tight_poll_{0};
  // This host runs more of the job's ranks than it has cores (runtime.cc).
  bool oversubscribed_ = false;
  // How long to hold the set's next cycle for more of a burst to arrive
  // (zero: start it now). Under the set's driver().
  std::chrono::microseconds BurstHold(ProcessSet& set, Clock::time_point now);
  // A transfer the waiting thread should sleep through rather than poll.
  bool SleepThrough(ProcessSet& set, Clock::time_point now) const;
};

}  // namespace jaxcache
