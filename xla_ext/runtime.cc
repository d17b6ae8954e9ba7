#include "runtime.h"

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
// A busy rank first polls its cycle for this long (yielding the core between
// polls): peers usually answer within tens of microseconds, and a sleep
// granularity of that order would otherwise double the latency.
constexpr microseconds kBusySpin{250};
}  // namespace

void Runtime::Start(MPI_Comm comm, const Config& config) {
  std::lock_guard<std::mutex> lock(current_mu);
  if (current && current->running()) return;  // idempotent
  if (current) current.reset();               // a previous, shut-down runtime
  InitReduceOps();
  std::shared_ptr<Runtime> rt(new Runtime(comm, config));
  rt->CheckConsistentConfig();
  rt->thread_ = std::thread([raw = rt.get()] { raw->Loop(); });
  current = std::move(rt);
}

void Runtime::Stop(double timeout_s) {
  std::shared_ptr<Runtime> rt;
  {
    std::lock_guard<std::mutex> lock(current_mu);
    rt = current;
  }
  if (!rt || !rt->thread_.joinable()) return;
  rt->want_shutdown_ = true;
  rt->queue_.Wake();
  std::unique_lock<std::mutex> lock(rt->done_mu_);
  bool done = rt->done_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                    [&] { return rt->loop_done_; });
  lock.unlock();
  if (done) {
    rt->thread_.join();
    return;
  }
  // The other ranks never answered (dead or hung): leave the thread behind
  // rather than hang the interpreter. The runtime object is leaked on purpose.
  std::fprintf(stderr,
               "jaxcache: warning: shutdown was not acknowledged by all ranks within %.0f s; "
               "leaving the background thread behind\n",
               timeout_s);
  rt->thread_.detach();
  new std::shared_ptr<Runtime>(rt);
}

std::shared_ptr<Runtime> Runtime::Current() {
  std::lock_guard<std::mutex> lock(current_mu);
  return current;
}

Runtime::Runtime(MPI_Comm comm, const Config& config)
    : config_(config), comm_(std::make_unique<Comm>(comm)) {
  // A peer that stays silent well past the stall shutdown bound is gone.
  if (config_.stall_shutdown_s > 0)
    comm_->SetAbortTimeout(std::max(2 * config_.stall_shutdown_s, config_.stall_shutdown_s + 5.0));
  if (!config_.timeline_path.empty() && comm_->rank() == 0 &&
      !timeline_.Open(config_.timeline_path, config_.timeline_mark_cycles)) {
    std::fprintf(stderr, "jaxcache: warning: cannot open timeline file '%s'\n",
                 config_.timeline_path.c_str());
  }
  controller_ = std::make_unique<Controller>(*comm_, config_, stats_, timeline_);
  operations_ = std::make_unique<Operations>(*comm_, config_, stats_, timeline_);
}

Runtime::~Runtime() {
  if (thread_.joinable()) thread_.join();
}

void Runtime::CheckConsistentConfig() {
  // Settings that shape the bitvector or the MPI call sequence must agree.
  int64_t mine[3] = {config_.cache_capacity, config_.fusion_threshold, config_.direct_threshold};
  mine[2] ^= config_.group_fusion ? 0 : (int64_t(1) << 62);
  int64_t lo[3], hi[3];
  MPI_Allreduce(mine, lo, 3, MPI_INT64_T, MPI_MIN, comm_->handle());
  MPI_Allreduce(mine, hi, 3, MPI_INT64_T, MPI_MAX, comm_->handle());
  const char* names[3] = {"JAXCACHE_CACHE_CAPACITY", "JAXCACHE_FUSION_THRESHOLD",
                          "JAXCACHE_DISABLE_GROUP_FUSION / direct threshold"};
  for (int i = 0; i < 3; ++i) {
    if (lo[i] != hi[i]) {
      throw std::runtime_error(std::string("jaxcache: ") + names[i] +
                               " differs across ranks (rank " + std::to_string(comm_->rank()) +
                               " has " + std::to_string(mine[i]) +
                               "); every rank must use the same setting");
    }
  }
}

Status Runtime::Submit(RequestPtr req) {
  Status st = queue_.Push(&req);
  return st;
}

void Runtime::Complete(RequestPtr req, Status status) {
  queue_.Finish(req->name);
  if (req->cheap_done) {
    req->done(status);
    return;
  }
  completions_.Push(std::move(req), std::move(status));
}

void Runtime::WaitBetweenPolls(microseconds* backoff, microseconds max) {
  if (queue_.WaitFor(*backoff)) {
    *backoff = kMinBackoff;  // activity here: peers are likely active too
  } else {
    *backoff = std::min(*backoff * 2, max);
  }
}

void Runtime::Loop() {
  const microseconds heartbeat{static_cast<int64_t>(config_.heartbeat_ms * 1000)};
  const microseconds cycle_time{static_cast<int64_t>(config_.cycle_time_ms * 1000)};
  microseconds idle_backoff = kMinBackoff;
  bool progress = true;
  Clock::time_point last_cycle{};
  Status why_closed = Status::Error(
      ErrorKind::kShutdown,
      "jaxcache: the runtime has been shut down; call jaxcache.init() before using collectives");
  try {
    for (;;) {
      if (!want_shutdown_) {
        if (!controller_->HasPending()) {
          // Idle: wake on new work or the heartbeat. With a cycle time, the first
          // request of a burst waits that long so that the rest of the burst joins
          // its cycle (and its fusion buffer).
          if (queue_.WaitFor(heartbeat) && cycle_time.count() > 0) std::this_thread::sleep_for(cycle_time);
          idle_backoff = kMinBackoff;
        } else if (!progress) {
          // Work is pending but waits for other ranks: do not spin cycles.
          if (queue_.WaitFor(idle_backoff)) idle_backoff = kMinBackoff;
          else idle_backoff = std::min(idle_backoff * 2, kBusyMaxBackoff);
        }
        if (cycle_time.count() > 0) std::this_thread::sleep_until(last_cycle + cycle_time);
      }
      for (auto& req : queue_.Drain()) controller_->Add(std::move(req));
      last_cycle = Clock::now();
      const bool busy = controller_->HasPending();
      microseconds backoff = kMinBackoff;
      const auto spin_until = last_cycle + (busy ? kBusySpin : microseconds(0));
      CycleOutcome out = controller_->RunCycle(want_shutdown_, [&] {
        if (Clock::now() < spin_until) {
          std::this_thread::yield();
          return;
        }
        WaitBetweenPolls(&backoff, busy ? kBusyMaxBackoff : kIdleMaxBackoff);
      });
      for (auto& [req, st] : out.failed) Complete(std::move(req), st);
      if (!out.work.empty()) {
        auto t0 = Clock::now();
        operations_->Execute(out.work, [this](RequestPtr r, Status s) { Complete(std::move(r), std::move(s)); });
        stats_.AddExecution(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      progress = out.progress;
      if (out.shutdown) break;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "jaxcache: fatal error in the background thread: %s\n", e.what());
    why_closed = Status::Error(ErrorKind::kInternal, std::string("jaxcache: runtime failed: ") + e.what());
    CycleOutcome out;
    controller_->FailAll(why_closed, &out);
    for (auto& [req, st] : out.failed) Complete(std::move(req), st);
  }
  queue_.Close(why_closed);
  for (auto& req : queue_.Drain()) Complete(std::move(req), why_closed);
  std::lock_guard<std::mutex> lock(done_mu_);
  loop_done_ = true;
  done_cv_.notify_all();
}

}  // namespace jaxcache
