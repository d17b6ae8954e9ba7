#include "process_set.h"

#include <algorithm>

namespace jaxcache {

namespace {
// " (process set 2: ranks are numbered within the set; its ranks 0, 1 are global ranks 1, 3)"
std::string ScopeNote(int32_t id, const std::vector<int>& global_ranks) {
  if (id == 0) return "";
  std::string s = " (process set " + std::to_string(id) +
                  ": ranks are numbered within the set; its ranks ";
  for (std::size_t i = 0; i < global_ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(i);
  s += " are global ranks ";
  for (std::size_t i = 0; i < global_ranks.size(); ++i)
    s += (i ? ", " : "") + std::to_string(global_ranks[i]);
  return s + ")";
}
}  // namespace

ProcessSet::ProcessSet(int32_t id, MPI_Comm comm, const std::vector<int>& global_ranks,
                       const Config& config, const Timeline& timeline, FaultInjector& faults,
                       CompletionQueue& completions, Wakeup& wakeup,
                       const std::atomic<bool>* abandon)
    : id_(id),
      global_ranks_(global_ranks),
      config_(config),
      timeline_(timeline.Scoped(id == 0 ? "" : "set " + std::to_string(id) + ": ")),
      faults_(faults),
      completions_(completions),
      comm_(std::make_unique<Comm>(comm, config.max_mpi_count, config.chunk_bytes)),
      p2p_(std::make_unique<P2PChannels>(comm)),
      table_(completions, wakeup, &stats_.completion_wakeups) {
  comm_->SetAbandonFlag(abandon);
  // A peer that stays silent well past the stall shutdown bound is gone.
  if (config_.stall_shutdown_s > 0)
    comm_->SetAbortTimeout(std::max(2 * config_.stall_shutdown_s, config_.stall_shutdown_s + 5.0));
  controller_ = std::make_unique<Controller>(*comm_, config_, stats_, timeline_, table_, faults_,
                                             ScopeNote(id, global_ranks));
  operations_ = std::make_unique<Operations>(*comm_, config_, stats_, timeline_, faults_);
}

bool ProcessSet::HasWork() {
  return controller_->HasPending() || controller_->HasFault() || table_.HasActive();
}

bool ProcessSet::Advance(const CycleIntent& intent) {
  // What this step of the cycle completes is handed over in one wake-up.
  CompletionQueue::Batch batch(completions_);
  if (!cycle_.valid()) {
    cycle_ = RunCycle(intent);
    cycle_.Start();  // runs until the cycle's allreduce waits for the other ranks
  } else if (!comm_->Poll()) {
    return false;
  }
  if (!cycle_.done()) return false;
  Task<> finished = std::move(cycle_);
  finished.Take();  // a failure inside the cycle surfaces here
  return true;
}

void ProcessSet::Complete(Request* req, const Status& status) {
  // (A request the table no longer holds is not read: it may be gone.)
  if (faults_.armed() && table_.StateOf(req) && faults_.Fire(FaultPoint::kComplete, req->name)) {
    Status failed = Status::Error(ErrorKind::kInternal,
                                  "jaxcache: completing '" + req->name + "' failed on rank " +
                                      std::to_string(comm_->rank()) + " (injected fault)");
    controller_->ReportFault(failed.message);
    table_.Complete(req, failed);
    return;
  }
  table_.Complete(req, status);
}

Task<> ProcessSet::RunCycle(CycleIntent intent) {
  for (Request* req : table_.TakeActive()) controller_->Add(req);
  last_cycle_ = Clock::now();
  const bool removing = remove_requested;
  CycleOutcome out = co_await controller_->Cycle(intent);
  if (out.shutdown && removing && id_ != 0) {
    // The set stops because remove_process_set() was called: say so.
    Status removed = Status::Error(
        ErrorKind::kShutdown, "jaxcache: process set " + std::to_string(id_) +
                                  " was removed (remove_process_set()); collectives in it can no "
                                  "longer complete");
    if (!out.never_asked.empty())  // forced: name the members that never asked
      removed.message += "; the set's " + RankList(out.never_asked) +
                         " never called remove_process_set() within JAXCACHE_SHUTDOWN_TIMEOUT" +
                         controller_->scope();
    out.shutdown_status = removed;
    for (auto& [req, st] : out.failed)
      if (st.kind == ErrorKind::kShutdown) st = removed;
  }
  for (auto& [req, st] : out.failed) Complete(req, st);
  for (Request* req : out.done) Complete(req, Status::Ok());
  if (!out.work.empty()) {
    auto t0 = Clock::now();
    std::string fault = co_await operations_->Execute(
        out.work, [this](Request* r, const Status& s) { Complete(r, s); });
    if (!fault.empty()) controller_->ReportFault(fault);
    stats_.AddExecution(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  progress_ = out.progress;
  if (out.shutdown) {
    const std::string& message = out.shutdown_status.message;
    table_.Close(Status::Error(ErrorKind::kShutdown, message));
    {
      std::lock_guard<std::mutex> lock(closing_mu_);
      closing_message_ = message;
      closed_without_ = out.never_asked;
    }
    stopped_ = true;
  }
}

std::string ProcessSet::closing_message() const {
  std::lock_guard<std::mutex> lock(closing_mu_);
  return closing_message_;
}

std::vector<int> ProcessSet::closed_without() const {
  std::lock_guard<std::mutex> lock(closing_mu_);
  return closed_without_;
}

}  // namespace jaxcache
