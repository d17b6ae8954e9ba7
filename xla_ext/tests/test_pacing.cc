// The background loop's timing policy (pacing.h): when a set's next cycle is
// due, and how the loop's sleep backs off while it waits for peers.
#include <chrono>

#include "check.h"
#include "pacing.h"

using namespace jaxcache;
using std::chrono::microseconds;
using std::chrono::milliseconds;

namespace {

const Clock::time_point kStart{};

CycleTiming Timing(microseconds since, bool work, bool progress = false) {
  CycleTiming t;
  t.since_last_cycle = since;
  t.work = work;
  t.last_progress = progress;
  return t;
}

}  // namespace

TEST(Pacing, IdleSetCyclesAtTheHeartbeat) {
  Pacing p(milliseconds(100), microseconds(0), kStart);
  Sweep s = p.NewSweep();
  CHECK(!p.CycleDue(Timing(milliseconds(30), false), &s));
  CHECK(s.until_due == milliseconds(70));
  CHECK(p.CycleDue(Timing(milliseconds(100), false), &s));
}

TEST(Pacing, WorkCyclesAtOnceAfterProgressElseAfterTheBackoff) {
  Pacing p(milliseconds(100), microseconds(0), kStart);
  Sweep s = p.NewSweep();
  CHECK(p.CycleDue(Timing(microseconds(0), true, /*progress=*/true), &s));
  CHECK(!p.CycleDue(Timing(microseconds(5), true), &s));
  CHECK(s.until_due == Pacing::kMinBackoff - microseconds(5));
  CHECK(p.CycleDue(Timing(Pacing::kMinBackoff, true), &s));
}

TEST(Pacing, StoppingSetIsAlwaysDue) {
  Pacing p(milliseconds(100), milliseconds(5), kStart);
  Sweep s = p.NewSweep();
  CycleTiming t = Timing(microseconds(0), true);
  t.must = true;
  CHECK(p.CycleDue(t, &s));
}

TEST(Pacing, CycleTimeSpacesCyclesAndHoldsABurst) {
  Pacing p(milliseconds(100), milliseconds(5), kStart);
  Sweep s = p.NewSweep();
  // Progress does not skip the spacing.
  CHECK(!p.CycleDue(Timing(milliseconds(2), true, true), &s));
  CHECK(s.until_due == milliseconds(3));
  CycleTiming t = Timing(milliseconds(6), true, true);
  CHECK(p.CycleDue(t, &s));
  // A burst that began 1 ms ago waits 4 more for the rest of it.
  t.burst_age = milliseconds(1);
  s = p.NewSweep();
  CHECK(!p.CycleDue(t, &s));
  CHECK(s.until_due == milliseconds(4));
}

TEST(Pacing, BackoffDoublesToItsCapsAndNewsResetsIt) {
  Pacing p(milliseconds(100), microseconds(0), kStart);
  CHECK(p.backoff() == Pacing::kMinBackoff);
  p.Slept(/*woken=*/false, /*arriving=*/true, kStart + microseconds(300));
  CHECK(p.backoff() == 2 * Pacing::kMinBackoff);
  for (int i = 0; i < 10; ++i) p.Slept(false, true, kStart + milliseconds(1));
  CHECK(p.backoff() == Pacing::kBusyMaxBackoff);  // a tenth of 1 ms is below the busy cap
  for (int i = 0; i < 20; ++i) p.Slept(false, true, kStart + std::chrono::seconds(10));
  CHECK(p.backoff() == Pacing::kLongMaxBackoff);  // a tenth of 10 s is above the long cap
  p.Slept(/*woken=*/true, true, kStart + std::chrono::seconds(10));
  CHECK(p.backoff() == Pacing::kMinBackoff);
}

TEST(Pacing, SleepIsTheBackoffWhilePeersAreExpectedElseTheNextDueCycle) {
  Pacing p(milliseconds(100), microseconds(0), kStart);
  Sweep s = p.NewSweep();
  s.until_due = milliseconds(7);
  CHECK(p.SleepFor(s) == milliseconds(7));
  s.arriving = true;
  CHECK(p.SleepFor(s) == Pacing::kMinBackoff);
  s.until_held = microseconds(5);
  CHECK(p.SleepFor(s) == microseconds(5));
  CHECK(p.KeepPolling(kStart + microseconds(100)));
  CHECK(!p.KeepPolling(kStart + Pacing::kBusySpin));
}
