#include "pacing.h"

#include <algorithm>

namespace jaxcache {

using std::chrono::microseconds;

Sweep Pacing::NewSweep() const {
  Sweep s;
  s.until_due = heartbeat_;
  return s;
}

// With a cycle time, cycles keep at least that far apart and the first request
// of a burst waits that long for the rest to join it. Otherwise a set with work
// cycles at once after progress, and after the backoff while it waits for peers;
// an idle set cycles at the heartbeat (idle cycles carry the flags).
bool Pacing::CycleDue(const CycleTiming& t, Sweep* sweep) const {
  microseconds spacing = cycle_time_ - t.since_last_cycle;
  if (has_cycle_time() && t.burst_age) spacing = std::max(spacing, cycle_time_ - *t.burst_age);
  const bool spaced = !has_cycle_time() || spacing.count() <= 0;
  const bool due = t.must || (t.since_last_cycle >= heartbeat_ && (!t.work || spaced)) ||
                   (t.work && spaced && (t.last_progress || t.since_last_cycle >= backoff_));
  if (due) return true;
  const microseconds wait =
      t.work ? std::max(spacing, backoff_ - t.since_last_cycle) : heartbeat_ - t.since_last_cycle;
  sweep->until_due = std::min(sweep->until_due, std::max(wait, microseconds(0)));
  return false;
}

void Pacing::Moved(Clock::time_point now) {
  backoff_ = kMinBackoff;
  idle_since_ = now;
}

microseconds Pacing::SleepFor(const Sweep& sweep) const {
  return std::min(sweep.arriving ? backoff_ : sweep.until_due, sweep.until_held);
}

void Pacing::Slept(bool woken, bool arriving, Clock::time_point now) {
  if (woken) {
    Moved(now);
  } else if (arriving) {
    const auto waited = std::chrono::duration_cast<microseconds>(now - idle_since_);
    backoff_ = std::min(backoff_ * 2, std::clamp(waited / 10, kBusyMaxBackoff, kLongMaxBackoff));
  }
}

}  // namespace jaxcache
