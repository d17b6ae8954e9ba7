#include "runtime.h"

#include "device_parts.h"

#include <sched.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "reduce_ops.h"

namespace jaxcache {

namespace {
std::mutex current_mu;
std::shared_ptr<Runtime> current;

using std::chrono::microseconds;

int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int RankOf(MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  return rank;
}
}  // namespace

void Runtime::Start(MPI_Comm comm, const Config& config) {
  std::lock_guard<std::mutex> lock(current_mu);
  if (current && current->running()) return;  // idempotent
  InitReduceOps();
  std::shared_ptr<Runtime> rt(new Runtime(comm, config));
  rt->thread_ = std::thread([raw = rt.get()] {
    NameThisThread("jaxcache-cycle");
    ExitAbortsOnThisThread();
    raw->Loop();
  });
  current = std::move(rt);
}

std::shared_ptr<Runtime> Runtime::Current() {
  std::lock_guard<std::mutex> lock(current_mu);
  return current;
}

Runtime::Runtime(MPI_Comm comm, const Config& config)
    : config_(config),
      faults_(std::make_unique<FaultInjector>(config.fault_inject, RankOf(comm))) {
  global_ = std::make_shared<ProcessSet>(0, comm, std::vector<int>(), config_, timeline_, *faults_,
                                         completions_, wakeup_, &abandon_);
  sets_[0] = global_;
  oversubscribed_ = global_->comm().local_size() > UsableCores();
  if (!oversubscribed_) tight_poll_ = Pacing::kInlineTightPoll;
  if (!config_.timeline_path.empty() && global_->comm().rank() == 0 &&
      !timeline_.Open(config_.timeline_path, config_.timeline_mark_cycles)) {
    std::fprintf(stderr, "jaxcache: warning: cannot open timeline file '%s'\n",
                 config_.timeline_path.c_str());
  }
}

std::string Runtime::StartTimeline(const std::string& path, bool mark_cycles) {
  if (global_->comm().rank() != 0) return "";
  if (timeline_.Open(path, mark_cycles)) return "";
  return "cannot create timeline file '" + path + "': " + std::strerror(errno);
}

void Runtime::StopTimeline() { timeline_.Close(); }

Runtime::~Runtime() {
  // (When MPI_Abort exits the process from the loop thread, AbortJob's exit
  // handler aborts it before static destructors run, so this never joins its
  // own thread; a gentler teardown here would wait on peers that are gone.)
  if (thread_.joinable()) thread_.join();
}

std::vector<std::shared_ptr<ProcessSet>> Runtime::Sets() const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  std::vector<std::shared_ptr<ProcessSet>> out;
  out.reserve(sets_.size());
  for (const auto& [id, set] : sets_) out.push_back(set);
  return out;
}

std::shared_ptr<ProcessSet> Runtime::Set(int32_t id) const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? nullptr : it->second;
}

std::vector<int32_t> Runtime::SetIds() const {
  std::lock_guard<std::mutex> lock(sets_mu_);
  std::vector<int32_t> ids;
  for (const auto& [id, set] : sets_) ids.push_back(id);
  return ids;
}

CycleIntent Runtime::IntentFor(const ProcessSet& set) const {
  return {shutdown_requested_ || set.remove_requested, shutdown_forced_ || set.remove_forced};
}

namespace {
// The ranks in `global` of the members of `comm`, in `comm`'s rank order.
std::vector<int> GlobalRanks(MPI_Comm comm, MPI_Comm global) {
  MPI_Group group, global_group;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(global, &global_group);
  int n = 0;
  MPI_Group_size(group, &n);
  std::vector<int> mine(n), out(n);
  for (int i = 0; i < n; ++i) mine[i] = i;
  MPI_Group_translate_ranks(group, n, mine.data(), global_group, out.data());
  MPI_Group_free(&group);
  MPI_Group_free(&global_group);
  return out;
}
}  // namespace

void Runtime::AddProcessSet(int32_t id, MPI_Comm comm) {
  if (id <= 0) throw std::invalid_argument("jaxcache: process set ids start at 1 (0 is the job)");
  if (Set(id))
    throw std::invalid_argument("jaxcache: process set " + std::to_string(id) +
                                " is registered already");
  auto set = std::make_shared<ProcessSet>(id, comm, GlobalRanks(comm, global_->comm().handle()),
                                          config_, timeline_, *faults_, completions_, wakeup_,
                                          &abandon_);
  {
    std::lock_guard<std::mutex> lock(sets_mu_);
    if (!sets_.emplace(id, std::move(set)).second)
      throw std::invalid_argument("jaxcache: process set " + std::to_string(id) +
                                  " is registered already");
  }
  wakeup_.Notify();
}

template <typename Pred>
bool Runtime::WaitUntil(double seconds, Pred done) {
  std::unique_lock<std::mutex> lock(done_mu_);
  return done_cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done(); });
}

std::string Runtime::RemoveProcessSet(int32_t id, double timeout_s) {
  if (id == 0) return "jaxcache: the global process set cannot be removed (call shutdown())";
  auto set = Set(id);
  if (!set) return "";
  set->remove_requested = true;
  wakeup_.Notify();
  if (!WaitUntil(timeout_s, [&] { return set->stopped(); })) {
    set->remove_forced = true;  // stop without the members that never asked
    wakeup_.Notify();
    double grace = std::max(2.0, 3 * config_.heartbeat_ms / 1000.0);
    if (!WaitUntil(grace, [&] { return set->stopped(); }))
      return "jaxcache: process set " + std::to_string(id) +
             " could not be removed: its other members do not answer";
  }
  std::lock_guard<std::mutex> lock(sets_mu_);
  sets_.erase(id);
  return set->closed_without().empty() ? "" : set->closing_message();
}

std::string Runtime::Stop(double timeout_s) {
  std::shared_ptr<Runtime> rt = Current();
  if (!rt || !rt->thread_.joinable()) return "";
  rt->shutdown_requested_ = true;
  rt->wakeup_.Notify();
  auto loop_done = [&] { return rt->loop_done_; };
  std::string outcome;
  if (!rt->WaitUntil(timeout_s, loop_done)) {
    // Stop waiting for the ranks that never called shutdown(): one forced
    // cycle tells every rank that still answers, and they stop with us.
    rt->shutdown_forced_ = true;
    rt->wakeup_.Notify();
    double grace = std::max(2.0, 3 * rt->config_.heartbeat_ms / 1000.0);
    if (!rt->WaitUntil(grace, loop_done)) {
      // Nobody answers at all (a dead rank, a broken link): leave the cycles.
      rt->abandon_ = true;
      rt->wakeup_.Notify();
      rt->WaitUntil(2.0, loop_done);
    }
    std::lock_guard<std::mutex> lock(rt->done_mu_);
    outcome = rt->loop_done_ ? rt->closing_message_
                             : "jaxcache: the background thread is stuck (the other ranks do not "
                               "answer); leaving it behind";
  }
  bool done;
  {
    std::lock_guard<std::mutex> lock(rt->done_mu_);
    done = rt->loop_done_;
  }
  // Joined first: the tables are closed once no driver can touch their requests.
  if (done) rt->thread_.join();
  Status closed = Status::Error(ErrorKind::kShutdown,
                                "jaxcache: the runtime has been shut down; call jaxcache.init() "
                                "before using collectives");
  // A loop thread still stuck (left behind below: no rank answers) completes
  // nothing it no longer holds (RequestTable::Complete does not read those),
  // but may still be inside an MPI call on their buffers: only a dead job ends so.
  rt->p2p_.Stop(closed);
  for (auto& set : rt->Sets()) set->table().Close(closed);
  // Devices' executions still waiting for the rest of their program's devices
  // cannot complete now; and no program's continuation may still run on a
  // device thread while the process goes on to exit.
  for (DevicePart& p : DeviceRendezvous::Get().TakeAll()) p.done.Run(closed);
  DeviceThreads::Get().Drain(std::chrono::seconds(10));
  if (!done) {
    // The runtime object is leaked on purpose: its thread still uses it.
    rt->thread_.detach();
    new std::shared_ptr<Runtime>(rt);
  }
  return outcome;
}

void Runtime::Fatal(const std::exception& e) {
  // This rank no longer knows which MPI calls its peers will make, so going on
  // could hang them: end the job, loudly.
  std::fprintf(stderr, "jaxcache: rank %d: fatal error in the runtime: %s; aborting the job\n",
               global_->comm().rank(), e.what());
  std::fflush(stderr);
  Status failed = Status::Error(ErrorKind::kInternal, std::string("jaxcache: fatal error: ") + e.what());
  for (auto& set : Sets()) set->table().Close(failed);
  AbortJob(global_->comm().handle(), 71);
}

void Runtime::Submit(RequestPtr req, bool drive) {
  std::shared_ptr<ProcessSet> set = Set(req->process_set);
  if (!set) {
    req->done.Run(Status::Error(
        ErrorKind::kInvalidArgument,
        "jaxcache: collective '" + req->name + "' names process set " +
            std::to_string(req->process_set) +
            ", which is not registered on this rank (removed, or this rank is not a member)"));
    return;
  }
  // A cycle time asks for bursts to be batched into one cycle: nobody drives inline then.
  if (!drive || config_.inline_spin_us <= 0 || config_.cycle_time_ms > 0) {
    set->table().Admit(std::move(req));
    return;
  }
  std::unique_lock<std::mutex> lock(set->driver(), std::try_to_lock);
  if (!lock.owns_lock() || set->stopped()) {  // someone else drives: they take it from the table
    set->table().Admit(std::move(req));
    return;
  }
  const Request* own = req.get();
  InlineCompletion scope(own);
  if (!set->table().Admit(std::move(req), /*notify=*/false)) {
    // Queued behind an earlier submission of its name (or refused at once).
    lock.unlock();
    if (!scope.done()) wakeup_.Notify();
    return;
  }
  Drive(*set, lock, [&scope] { return scope.done(); });
  if (scope.done()) ++set->stats().completed_inline;
}

void Runtime::DriveUntil(int32_t set_id, const std::function<bool()>& done) {
  if (config_.inline_spin_us <= 0 || config_.cycle_time_ms > 0) return;
  std::shared_ptr<ProcessSet> set = Set(set_id);
  if (!set) return;
  std::unique_lock<std::mutex> lock(set->driver(), std::try_to_lock);
  if (!lock.owns_lock() || set->stopped()) return;  // the driver completes it
  Drive(*set, lock, done);
}

microseconds Runtime::BurstHold(ProcessSet& set, Clock::time_point now) {
  microseconds hold{0};
  // A cycle time batches bursts its own way; a stopping set does not wait.
  if (oversubscribed_ && config_.cycle_time_ms <= 0 && !set.cycle_in_flight() &&
      !IntentFor(set).shutdown_requested) {
    if (auto burst = set.table().Burst(); burst && burst->count >= 2) {
      using std::chrono::duration_cast;
      hold = std::min(Pacing::kBurstQuiet - duration_cast<microseconds>(now - burst->last_submitted),
                      Pacing::kBurstCap - duration_cast<microseconds>(now - burst->first_submitted));
    }
  }
  if (hold.count() <= 0) {
    set.holding_burst = false;
    return microseconds(0);
  }
  if (!set.holding_burst) {
    set.holding_burst = true;
    ++set.stats().burst_holds;
  }
  return hold;
}

bool Runtime::SleepThrough(ProcessSet& set, Clock::time_point now) const {
  return oversubscribed_ && set.transferring() && now - set.parked_since() > Pacing::kOversubscribedTransferPoll &&
         set.table().HasActive();
}

void Runtime::Drive(ProcessSet& set_ref, std::unique_lock<std::mutex>& lock,
                    const std::function<bool()>& done) {
  ProcessSet* set = &set_ref;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::microseconds(static_cast<int64_t>(config_.inline_spin_us));
  try {
    while (!done() && !set->stopped()) {
      // A burst still arriving: the background thread starts the cycle once it pauses.
      if (BurstHold(*set, Clock::now()).count() > 0) break;
      // A cycle that finished without completing ours starts the next at once.
      if (set->Advance(IntentFor(*set))) continue;
      // Data moving between ranks that are all here (at most kInlineBytes of
      // it) finishes soon; the background thread would only poll it the same
      // way, after a wake-up.
      const auto now = Clock::now();
      if (now > deadline &&
          !(set->transferring() && now < deadline + Pacing::kInlineTransferGrace && !SleepThrough(*set, now)))
        break;
      // A peer that is running answers within microseconds: poll without a
      // system call at first; later yield, in case the peer needs this core.
      if (now - start > tight_poll_) std::this_thread::yield();
    }
  } catch (const AbandonedError&) {
    // Stop() gave up on the other ranks; the background thread winds down.
  } catch (const std::exception& e) {
    Fatal(e);
  }
  const bool more = set->cycle_in_flight() || set->table().HasActive() || set->stopped();
  lock.unlock();
  // Not done in time (or more to do): the background thread takes over.
  if (!done() || more) wakeup_.Notify();
}

void Runtime::Loop() {
  Pacing pacing(microseconds(static_cast<int64_t>(config_.heartbeat_ms * 1000)),
                microseconds(static_cast<int64_t>(config_.cycle_time_ms * 1000)), Clock::now());
  uint64_t seen = wakeup_.generation();
  Status closing = Status::Error(
      ErrorKind::kShutdown,
      "jaxcache: the runtime has been shut down; call jaxcache.init() before using collectives");
  try {
    for (;;) {
      const Sweep sweep = SweepSets(pacing);
      if (sweep.all_stopped) {
        closing = Status::Error(ErrorKind::kShutdown, global_->closing_message());
        break;
      }
      Pause(sweep, pacing, &seen);
    }
  } catch (const AbandonedError&) {
    closing = Status::Error(ErrorKind::kShutdown,
                            "jaxcache: the runtime was shut down without the other ranks, which "
                            "did not answer (a rank died or hangs)");
  } catch (const std::exception& e) {
    Fatal(e);
  }
  for (auto& set : Sets()) set->table().Close(closing);
  std::lock_guard<std::mutex> lock(done_mu_);
  closing_message_ = closing.message;
  loop_done_ = true;
  done_cv_.notify_all();
}

Sweep Runtime::SweepSets(const Pacing& pacing) {
  Sweep sweep = pacing.NewSweep();
  const auto now = Clock::now();
  const bool stopping = shutdown_requested_ || shutdown_forced_;
  for (auto& set : Sets()) {
    if (set->stopped()) {
      if (set->id() != 0 && set->remove_requested) {  // removed: wake its remover
        std::lock_guard<std::mutex> lock(done_mu_);
        done_cv_.notify_all();
      }
      continue;
    }
    sweep.all_stopped = false;
    std::unique_lock<std::mutex> lock(set->driver(), std::try_to_lock);
    if (!lock.owns_lock()) {  // a submitter drives it right now
      sweep.arriving = true;
      continue;
    }
    VisitSet(*set, now, stopping, pacing, &sweep);
  }
  return sweep;
}

// One set in a pass: advances its cycle when one is in flight or due.
void Runtime::VisitSet(ProcessSet& set, Clock::time_point now, bool stopping, const Pacing& pacing,
                       Sweep* sweep) {
  if (auto hold = BurstHold(set, now); hold.count() > 0) {
    sweep->until_held = std::min(sweep->until_held, hold);
    return;
  }
  if (!set.cycle_in_flight() && !pacing.CycleDue(TimingOf(set, now, stopping, pacing), sweep)) return;
  if (set.Advance(IntentFor(set))) sweep->moved = true;
  if (set.stopped()) {
    std::lock_guard<std::mutex> lock(done_mu_);
    done_cv_.notify_all();
  }
  if (set.transferring()) {
    sweep->transferring = true;
    if (!SleepThrough(set, Clock::now())) sweep->poll_transfer = true;
  } else if (set.cycle_in_flight()) {
    sweep->arriving = true;
  }
}

CycleTiming Runtime::TimingOf(ProcessSet& set, Clock::time_point now, bool stopping,
                              const Pacing& pacing) {
  using std::chrono::duration_cast;
  CycleTiming t;
  t.since_last_cycle = duration_cast<microseconds>(now - set.last_cycle());
  t.work = set.HasWork();
  t.last_progress = set.last_progress();
  t.must = stopping || set.remove_requested;
  if (pacing.has_cycle_time())
    if (auto burst = set.table().Burst()) t.burst_age = duration_cast<microseconds>(now - burst->first_submitted);
  return t;
}

// After a pass: poll again at once while data moves, keep polling a while when
// peers are expected, otherwise sleep until news, the next due cycle, or the backoff.
void Runtime::Pause(const Sweep& sweep, Pacing& pacing, uint64_t* seen) {
  if (sweep.moved || sweep.transferring) {
    pacing.Moved(Clock::now());
    // Data moving between ranks that are all here: poll without sleeping,
    // unless every transfer is one to sleep through (SleepThrough).
    if (sweep.transferring && !sweep.moved && !sweep.poll_transfer) {
      ++global_->stats().transfer_sleeps;
      wakeup_.WaitFor(Pacing::kMinBackoff, seen);
    } else if (sweep.transferring) {
      std::this_thread::yield();
    }
    return;
  }
  if (sweep.arriving && pacing.KeepPolling(Clock::now())) {
    std::this_thread::yield();
    return;
  }
  const bool woken = wakeup_.WaitFor(pacing.SleepFor(sweep), seen);
  pacing.Slept(woken, sweep.arriving, Clock::now());
}

}  // namespace jaxcache
