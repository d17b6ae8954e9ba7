// The background loop's timing policy in one place: when a process set's next
// cycle is due, how long the loop polls, yields or sleeps when nothing moved,
// and the constants that the submitters' inline driving shares with it.
#pragma once

#include <chrono>
#include <optional>

#include "request.h"

namespace jaxcache {

// What the loop knows of one set when it decides whether to start its next cycle.
struct CycleTiming {
  std::chrono::microseconds since_last_cycle{0};
  bool work = false;           // this rank has requests for the next cycle
  bool last_progress = false;  // the set's last cycle decided something
  bool must = false;           // the set is stopping or being removed
  // Since the first request of the burst now arriving (only with a cycle time).
  std::optional<std::chrono::microseconds> burst_age;
};

// What one pass of the loop over the process sets found.
struct Sweep {
  bool moved = false;          // some set's cycle advanced
  bool transferring = false;   // some set has data moving between ranks
  bool poll_transfer = false;  // ... and it is worth polling without sleeping
  bool arriving = false;       // a submitter drives a set, or a cycle waits for peers
  bool all_stopped = true;
  std::chrono::microseconds until_due;  // the next due cycle
  std::chrono::microseconds until_held = std::chrono::microseconds::max();  // a burst's hold ends
};

class Pacing {
 public:
  using microseconds = std::chrono::microseconds;

  // The loop's shortest sleep between polls, where its backoff starts.
  static constexpr microseconds kMinBackoff{20};
  // Sleeps between polls grow to this, then to a tenth of the time waited. Kept
  // short: with more ranks than cores a descheduled peer answers ~1 ms late
  // (a longer cap: benchmarks/README.md, "The runtime's constants").
  static constexpr microseconds kBusyMaxBackoff{100};
  static constexpr microseconds kLongMaxBackoff{20000};
  // A rank waiting for its peers first polls for this long (yielding the core
  // between polls): peers usually answer within tens of microseconds, and a
  // sleep granularity of that order would otherwise double the latency.
  static constexpr microseconds kBusySpin{250};
  // How much longer than JAXCACHE_INLINE_SPIN_US a submitter keeps driving its
  // request once the data is moving (a slow link: hand over after this).
  static constexpr microseconds kInlineTransferGrace{1000};
  // How long a submitter polls its cycle before it starts yielding the core
  // between polls: a sched_yield costs about as much as a running peer's answer
  // (jitted 1000 x 16-float per-leaf step at 2 ranks: see benchmarks/README.md).
  // Only while this host has a core per rank: otherwise the peer may be waiting
  // for this very core, and yielding at once lets it answer.
  static constexpr microseconds kInlineTightPoll{10};
  // Where ranks outnumber cores and more requests wait behind the cycle, a
  // transfer still in flight after this long is waited for by sleeping
  // kMinBackoff between polls, by the background thread alone: a thread that
  // yield-polls through a transfer of milliseconds takes the core from the
  // ranks whose turn it is (their copy-in into the fusion buffer waited in the
  // run queue many times as long as it took, /proc schedstat) and spends its own
  // scheduler credit, so it waits in turn once it has work. Short steps (the
  // cycle's messages, small data) finish before it and are still polled, and so
  // is a transfer with nothing behind it: MPI's schedule advances only when
  // polled (a large allreduce at 3 ranks was slower when slept through)
  // (benchmarks/README.md, "Figures behind the runtime's comments").
  static constexpr microseconds kOversubscribedTransferPoll{200};
  // Where ranks outnumber cores, a cycle started while this rank's requests are
  // still arriving (XLA:CPU starting a step's independent collectives on its
  // threads, a backward pass's hooks) carries a few of them, and the rest take
  // more cycles, each a round of context switches between the ranks: the next
  // cycle waits until no new request has come for kBurstQuiet, at most kBurstCap
  // after the first (benchmarks/README.md, the constants table). One request at
  // a time (a dependent chain) never waits.
  static constexpr microseconds kBurstQuiet{100};
  static constexpr microseconds kBurstCap{2000};

  Pacing(microseconds heartbeat, microseconds cycle_time, Clock::time_point now)
      : heartbeat_(heartbeat), cycle_time_(cycle_time), idle_since_(now) {}

  // A pass over the sets starts with the heartbeat as the latest due cycle.
  Sweep NewSweep() const;
  bool has_cycle_time() const { return cycle_time_.count() > 0; }
  // Whether a set's next cycle is due now; if not, lowers sweep->until_due to when it is.
  bool CycleDue(const CycleTiming& t, Sweep* sweep) const;
  // Something moved: the next pass polls at once and backs off from the start.
  void Moved(Clock::time_point now);
  // Nothing moved but peers are expected: keep polling (yielding the core) a while.
  bool KeepPolling(Clock::time_point now) const { return now - idle_since_ < kBusySpin; }
  // How long to sleep when nothing moved.
  microseconds SleepFor(const Sweep& sweep) const;
  // After the sleep: news starts over; waiting on for peers backs off further,
  // at most a tenth of the time waited so far, so a rank waiting seconds for a
  // late peer costs next to nothing.
  void Slept(bool woken, bool arriving, Clock::time_point now);
  microseconds backoff() const { return backoff_; }

 private:
  microseconds heartbeat_, cycle_time_;
  microseconds backoff_ = kMinBackoff;
  Clock::time_point idle_since_;
};

}  // namespace jaxcache
