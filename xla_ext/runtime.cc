#include "runtime.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "reduce_ops.h"

namespace jaxcache {

namespace {
std::mutex current_mu;
std::shared_ptr<Runtime> current;

using std::chrono::microseconds;
constexpr microseconds kMinBackoff{20};
constexpr microseconds kBusyMaxBackoff{1000};
constexpr microseconds kIdleMaxBackoff{10000};
constexpr microseconds kLongMaxBackoff{20000};
Status Abandoned() {
  return Status::Error(ErrorKind::kShutdown,
                       "jaxcache: the runtime was shut down without the other ranks, which did "
                       "not answer (a rank died or hangs)");
}

// A busy rank first polls its cycle for this long (yielding the core between
// polls): peers usually answer within tens of microseconds, and a sleep
// granularity of that order would otherwise double the latency.
constexpr microseconds kBusySpin{250};
}  // namespace

void Runtime::Start(MPI_Comm comm, const Config& config) {
  std::lock_guard<std::mutex> lock(current_mu);
  if (current && current->running()) return;  // idempotent
  InitReduceOps();
  std::shared_ptr<Runtime> rt(new Runtime(comm, config));
  rt->thread_ = std::thread([raw = rt.get()] { raw->Loop(); });
  current = std::move(rt);
}

bool Runtime::WaitDone(double seconds) {
  std::unique_lock<std::mutex> lock(done_mu_);
  return done_cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return loop_done_; });
}

std::string Runtime::Stop(double timeout_s) {
  std::shared_ptr<Runtime> rt = Current();
  if (!rt || !rt->thread_.joinable()) return "";
  rt->shutdown_requested_ = true;
  rt->table_.Wake();
  std::string outcome;
  if (!rt->WaitDone(timeout_s)) {
    // Stop waiting for the ranks that never called shutdown(): one forced
    // cycle tells every rank that still answers, and they stop with us.
    rt->shutdown_forced_ = true;
    rt->table_.Wake();
    double grace = std::max(2.0, 3 * rt->config_.heartbeat_ms / 1000.0);
    if (!rt->WaitDone(grace)) {
      // Nobody answers at all (a dead rank, a broken link): leave the cycle.
      rt->abandon_ = true;
      rt->WaitDone(2.0);
    }
    std::lock_guard<std::mutex> lock(rt->done_mu_);
    outcome = rt->loop_done_ ? rt->closing_message_
                             : "jaxcache: the background thread is stuck inside MPI (the other "
                               "ranks do not answer); leaving it behind";
  }
  rt->table_.Close(Status::Error(ErrorKind::kShutdown,
                                 "jaxcache: the runtime has been shut down; call jaxcache.init() "
                                 "before using collectives"));
  bool done;
  {
    std::lock_guard<std::mutex> lock(rt->done_mu_);
    done = rt->loop_done_;
  }
  if (done) {
    rt->thread_.join();
  } else {
    // The runtime object is leaked on purpose: its thread still uses it.
    rt->thread_.detach();
    new std::shared_ptr<Runtime>(rt);
  }
  return outcome;
}

std::shared_ptr<Runtime> Runtime::Current() {
  std::lock_guard<std::mutex> lock(current_mu);
  return current;
}

Runtime::Runtime(MPI_Comm comm, const Config& config)
    : config_(config),
      comm_(std::make_unique<Comm>(comm, config.max_mpi_count)),
      faults_(config.fault_inject, comm_->rank()),
      closing_(Status::Error(ErrorKind::kShutdown,
                             "jaxcache: the runtime has been shut down; call jaxcache.init() "
                             "before using collectives")) {
  comm_->SetAbandonFlag(&abandon_);
  // A peer that stays silent well past the stall shutdown bound is gone.
  if (config_.stall_shutdown_s > 0)
    comm_->SetAbortTimeout(std::max(2 * config_.stall_shutdown_s, config_.stall_shutdown_s + 5.0));
  if (!config_.timeline_path.empty() && comm_->rank() == 0 &&
      !timeline_.Open(config_.timeline_path, config_.timeline_mark_cycles)) {
    std::fprintf(stderr, "jaxcache: warning: cannot open timeline file '%s'\n",
                 config_.timeline_path.c_str());
  }
  controller_ = std::make_unique<Controller>(*comm_, config_, stats_, timeline_, table_, faults_);
  operations_ = std::make_unique<Operations>(*comm_, config_, stats_, timeline_, faults_);
}

Runtime::~Runtime() {
  if (thread_.joinable()) thread_.join();
}

void Runtime::Complete(Request* req, const Status& status) {
  if (faults_.armed() && faults_.Fire(FaultPoint::kComplete, req->name)) {
    Status failed = Status::Error(ErrorKind::kInternal,
                                  "jaxcache: completing '" + req->name + "' failed on rank " +
                                      std::to_string(comm_->rank()) + " (injected fault)");
    controller_->ReportFault(failed.message);
    table_.Complete(req, failed);
    return;
  }
  table_.Complete(req, status);
}

void Runtime::Fatal(const std::exception& e) {
  // This rank no longer knows which MPI calls its peers will make, so going on
  // could hang them: end the job, loudly.
  std::fprintf(stderr, "jaxcache: rank %d: fatal error in the runtime: %s; aborting the job\n",
               comm_->rank(), e.what());
  std::fflush(stderr);
  table_.Close(Status::Error(ErrorKind::kInternal, std::string("jaxcache: fatal error: ") + e.what()));
  MPI_Abort(comm_->handle(), 71);
  std::abort();
}

void Runtime::RunOutcome(CycleOutcome& out) {
  for (auto& [req, st] : out.failed) Complete(req, st);
  for (Request* req : out.done) Complete(req, Status::Ok());
  if (!out.work.empty()) {
    auto t0 = Clock::now();
    std::string fault = operations_->Execute(
        out.work, [this](Request* r, const Status& s) { Complete(r, s); });
    if (!fault.empty()) controller_->ReportFault(fault);
    stats_.AddExecution(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  progress_ = out.progress;
  if (out.shutdown) {
    closing_ = out.shutdown_status;
    stop_loop_ = true;
  }
}

bool Runtime::Advance() {
  if (!controller_->cycle_posted()) {
    for (Request* req : table_.TakeActive()) controller_->Add(req);
    controller_->BeginCycle({shutdown_requested_, shutdown_forced_});
  }
  if (!controller_->TestCycle()) return false;
  CycleOutcome out = controller_->FinishCycle();
  RunOutcome(out);
  return true;
}

void Runtime::Submit(RequestPtr req, bool drive) {
  // A cycle time asks for bursts to be batched into one cycle: nobody drives inline then.
  if (!drive || config_.inline_spin_us <= 0 || config_.cycle_time_ms > 0) {
    table_.Admit(std::move(req));
    return;
  }
  std::unique_lock<std::mutex> lock(driver_mu_, std::try_to_lock);
  if (!lock.owns_lock() || stop_loop_) {  // someone else drives: they take it from the table
    table_.Admit(std::move(req));
    return;
  }
  const Request* own = req.get();
  InlineCompletion scope(own);
  if (!table_.Admit(std::move(req), /*notify=*/false)) {
    // Queued behind an earlier submission of its name (or refused at once).
    lock.unlock();
    if (!scope.done()) table_.Wake();
    return;
  }
  const auto deadline =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(config_.inline_spin_us));
  try {
    while (!scope.done() && !stop_loop_) {
      // A cycle that finished without completing ours starts the next at once.
      if (Advance()) continue;
      if (Clock::now() > deadline) break;
      std::this_thread::yield();  // the peers may need this core
    }
  } catch (const AbandonedError&) {
    closing_ = Abandoned();
    stop_loop_ = true;
  } catch (const std::exception& e) {
    Fatal(e);
  }
  lock.unlock();
  // Not done in time: the background thread takes over (the posted cycle, if
  // any, and the request, which is in the controller or the table).
  if (!scope.done()) table_.Wake();
}

void Runtime::Loop() {
  const microseconds heartbeat{static_cast<int64_t>(config_.heartbeat_ms * 1000)};
  const microseconds cycle_time{static_cast<int64_t>(config_.cycle_time_ms * 1000)};
  microseconds idle_backoff = kMinBackoff;
  Clock::time_point last_cycle{};
  uint64_t seen = table_.generation();
  try {
    while (!stop_loop_) {
      const bool stopping = shutdown_requested_ || shutdown_forced_;
      if (!stopping && !controller_->cycle_posted()) {
        if (!controller_->HasPending() && !controller_->HasFault()) {
          // Idle: wake on new work or the heartbeat. With a cycle time, the first
          // request of a burst waits that long so that the rest of the burst joins
          // its cycle (and its fusion buffer).
          if (table_.WaitForWork(heartbeat) && cycle_time.count() > 0)
            std::this_thread::sleep_for(cycle_time);
          idle_backoff = kMinBackoff;
        } else if (!progress_) {
          // Work is pending but waits for other ranks: do not spin cycles.
          if (table_.WaitForNews(idle_backoff, &seen)) idle_backoff = kMinBackoff;
          else idle_backoff = std::min(idle_backoff * 2, kBusyMaxBackoff);
        }
        if (cycle_time.count() > 0) std::this_thread::sleep_until(last_cycle + cycle_time);
      }
      std::lock_guard<std::mutex> lock(driver_mu_);
      if (stop_loop_) break;
      const bool resumed = controller_->cycle_posted();  // handed over by a submitter
      if (!resumed) last_cycle = Clock::now();
      const bool busy = resumed || controller_->HasPending() || table_.generation() != seen;
      microseconds backoff = kMinBackoff;
      const auto waiting_since = Clock::now();  // a handed-over cycle has just been polled
      const auto spin_until = waiting_since + (busy ? kBusySpin : microseconds(0));
      while (!Advance()) {
        if (Clock::now() < spin_until) {
          std::this_thread::yield();
          continue;
        }
        // Sleeps whatever is waiting in the table: only news shortens it. A long
        // wait may sleep longer (at most a tenth of the time waited so far), so a
        // rank waiting seconds for a late peer costs next to nothing.
        if (table_.WaitForNews(backoff, &seen)) {
          backoff = kMinBackoff;
        } else {
          auto waited = std::chrono::duration_cast<microseconds>(Clock::now() - waiting_since);
          auto cap = std::clamp(waited / 10, busy ? kBusyMaxBackoff : kIdleMaxBackoff, kLongMaxBackoff);
          backoff = std::min(backoff * 2, cap);
        }
      }
    }
  } catch (const AbandonedError& e) {
    closing_ = Abandoned();
  } catch (const std::exception& e) {
    Fatal(e);
  }
  table_.Close(closing_);
  std::lock_guard<std::mutex> lock(done_mu_);
  closing_message_ = closing_.message;
  loop_done_ = true;
  done_cv_.notify_all();
}

}  // namespace jaxcache
