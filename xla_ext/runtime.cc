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
      faults_(config.fault_inject, comm_->rank()) {
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

void Runtime::Loop() {
  const microseconds heartbeat{static_cast<int64_t>(config_.heartbeat_ms * 1000)};
  const microseconds cycle_time{static_cast<int64_t>(config_.cycle_time_ms * 1000)};
  microseconds idle_backoff = kMinBackoff;
  bool progress = true;
  Clock::time_point last_cycle{};
  uint64_t seen = table_.generation();
  Status closing = Status::Error(
      ErrorKind::kShutdown,
      "jaxcache: the runtime has been shut down; call jaxcache.init() before using collectives");
  try {
    for (;;) {
      const bool stopping = shutdown_requested_ || shutdown_forced_;
      if (!stopping) {
        if (!controller_->HasPending()) {
          // Idle: wake on new work or the heartbeat. With a cycle time, the first
          // request of a burst waits that long so that the rest of the burst joins
          // its cycle (and its fusion buffer).
          if (table_.WaitForWork(heartbeat) && cycle_time.count() > 0)
            std::this_thread::sleep_for(cycle_time);
          idle_backoff = kMinBackoff;
        } else if (!progress) {
          // Work is pending but waits for other ranks: do not spin cycles.
          if (table_.WaitForNews(idle_backoff, &seen)) idle_backoff = kMinBackoff;
          else idle_backoff = std::min(idle_backoff * 2, kBusyMaxBackoff);
        }
        if (cycle_time.count() > 0) std::this_thread::sleep_until(last_cycle + cycle_time);
      }
      for (Request* req : table_.TakeActive()) controller_->Add(req);
      last_cycle = Clock::now();
      const bool busy = controller_->HasPending();
      microseconds backoff = kMinBackoff;
      const auto spin_until = last_cycle + (busy ? kBusySpin : microseconds(0));
      const CycleIntent intent{shutdown_requested_, shutdown_forced_};
      CycleOutcome out = controller_->RunCycle(intent, [&] {
        if (Clock::now() < spin_until) {
          std::this_thread::yield();
          return;
        }
        // Sleeps whatever is waiting in the table: only news shortens it. A long
        // wait may sleep longer (at most a tenth of the time waited so far), so a
        // rank waiting seconds for a late peer costs next to nothing.
        if (table_.WaitForNews(backoff, &seen)) {
          backoff = kMinBackoff;
        } else {
          auto waited = std::chrono::duration_cast<microseconds>(Clock::now() - last_cycle);
          auto cap = std::clamp(waited / 10, busy ? kBusyMaxBackoff : kIdleMaxBackoff, kLongMaxBackoff);
          backoff = std::min(backoff * 2, cap);
        }
      });
      for (auto& [req, st] : out.failed) Complete(req, st);
      if (!out.work.empty()) {
        auto t0 = Clock::now();
        std::string fault = operations_->Execute(
            out.work, [this](Request* r, const Status& s) { Complete(r, s); });
        if (!fault.empty()) controller_->ReportFault(fault);
        stats_.AddExecution(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      progress = out.progress;
      if (out.shutdown) {
        closing = out.shutdown_status;
        break;
      }
    }
  } catch (const AbandonedError& e) {
    closing = Status::Error(ErrorKind::kShutdown,
                            "jaxcache: the runtime was shut down without the other ranks, which "
                            "did not answer (a rank died or hangs)");
  } catch (const std::exception& e) {
    // A failure outside every fault-handling step: this rank no longer knows
    // which MPI calls its peers will make, so continuing could hang them.
    std::fprintf(stderr, "jaxcache: rank %d: fatal error in the runtime: %s; aborting the job\n",
                 comm_->rank(), e.what());
    std::fflush(stderr);
    table_.Close(Status::Error(ErrorKind::kInternal, std::string("jaxcache: fatal error: ") + e.what()));
    MPI_Abort(comm_->handle(), 71);
  }
  table_.Close(closing);
  std::lock_guard<std::mutex> lock(done_mu_);
  closing_message_ = closing.message;
  loop_done_ = true;
  done_cv_.notify_all();
}

}  // namespace jaxcache
