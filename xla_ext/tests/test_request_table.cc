// RequestTable: one active submission per name, numbering, completion exactly
// once, refusals, cancel and close.
#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "completion_queue.h"
#include "request_table.h"

using namespace jaxcache;

namespace {

struct Outcome {
  std::string name;
  uint64_t seq;
  Status status;
  std::thread::id thread;
};

// What the completions reported, in order (they may run on the completion thread).
class Log {
 public:
  void Add(Outcome o) {
    std::lock_guard<std::mutex> lock(mu_);
    outcomes_.push_back(std::move(o));
  }
  std::vector<Outcome> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return outcomes_;
  }

 private:
  std::mutex mu_;
  std::vector<Outcome> outcomes_;
};

// A request whose completion records its outcome. `cheap` completions run on
// the completing thread; the others go through the completion queue.
RequestPtr MakeRequest(const std::string& name, Log& log, bool cheap = true) {
  auto req = std::make_unique<Request>();
  req->name = name;
  const Request* raw = req.get();  // alive while its completion runs
  req->done = Completion(
      [&log, raw](const Status& st) { log.Add({raw->name, raw->seq, st, std::this_thread::get_id()}); },
      cheap);
  return req;
}

// The usual set-up: a table with its completion queue and wakeup. The log
// outlives the table: destroying the table completes what it still holds.
struct Fixture {
  Log log;
  CompletionQueue completions;
  Wakeup wakeup;
  RequestTable table{completions, wakeup};
  // Admits a request for `name`; returns it (owned by the table) and whether it is active.
  Request* Admit(const std::string& name, bool* active = nullptr, bool notify = true) {
    RequestPtr req = MakeRequest(name, log);
    Request* raw = req.get();
    const bool now = table.Admit(std::move(req), notify);
    if (active) *active = now;
    return raw;
  }
};

using Pending = std::vector<std::pair<std::string, uint64_t>>;

Status Error(ErrorKind kind, const std::string& msg) { return Status::Error(kind, msg); }

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST(RequestTable, FirstSubmissionIsActiveAndTakenOnce) {
  Fixture f;
  const uint64_t before = f.wakeup.generation();
  bool active = false;
  Request* a = f.Admit("a", &active);
  CHECK(active);
  CHECK_EQ(a->seq, 0u);
  CHECK(f.wakeup.generation() > before);  // the background thread is woken
  CHECK(f.table.HasActive());
  CHECK(f.table.StateOf(a) == RequestState::kActive);
  const std::vector<Request*> taken = f.table.TakeActive();
  CHECK(f.table.StateOf(a) == RequestState::kTaken);
  CHECK_EQ(taken.size(), 1u);
  CHECK(!taken.empty() && taken[0] == a);
  CHECK(!f.table.HasActive());
  CHECK(f.table.TakeActive().empty());
  CHECK(f.log.Get().empty());  // nothing completed yet
}

TEST(RequestTable, SameNameQueuesBehindActiveAndActivatesOnCompletion) {
  Fixture f;
  bool active = true;
  Request* first = f.Admit("a");
  Request* second = f.Admit("a", &active);
  CHECK(!active);
  CHECK_EQ(second->seq, 1u);
  CHECK_EQ(f.table.TakeActive().size(), 1u);  // only the first
  CHECK(f.table.Pending() == (Pending{{"a", 0}, {"a", 1}}));
  f.table.Complete(first, Status::Ok());
  const auto outcomes = f.log.Get();
  CHECK_EQ(outcomes.size(), 1u);
  CHECK(!outcomes.empty() && outcomes[0].status.ok() && outcomes[0].seq == 0);
  const auto next = f.table.TakeActive();
  CHECK(next.size() == 1 && next[0] == second);
  CHECK(f.table.Pending() == (Pending{{"a", 1}}));
}

TEST(RequestTable, CompletingAWaitingRequestIsACheckedError) {
  Fixture f;
  Request* first = f.Admit("a");
  Request* second = f.Admit("a");
  CHECK(f.table.StateOf(second) == RequestState::kQueued);
  CHECK_THROWS(f.table.Complete(second, Error(ErrorKind::kInternal, "not its turn")));
  CHECK(f.log.Get().empty());
  CHECK(f.table.Pending() == (Pending{{"a", 0}, {"a", 1}}));
  // The active one still completes normally, with its own status; then the second's turn.
  CHECK(f.table.Complete(first, Error(ErrorKind::kMismatch, "m")));
  const auto outcomes = f.log.Get();
  CHECK(outcomes.size() == 1 && outcomes[0].seq == 0 && outcomes[0].status.kind == ErrorKind::kMismatch);
  CHECK(f.table.StateOf(second) == RequestState::kActive);
}

TEST(RequestTable, ARequestNoLongerHeldIsLeftAloneUnread) {
  // Completed, cancelled or closed: the table freed the request, so a driver's stale
  // pointer must not be read (under the sanitizer build a read fails this test).
  Fixture f;
  Request* a = f.Admit("a");
  f.table.TakeActive();
  CHECK(f.table.Complete(a, Status::Ok()));
  CHECK(!f.table.StateOf(a));
  CHECK(!f.table.Complete(a, Error(ErrorKind::kInternal, "twice")));
  Request* b = f.Admit("b");
  f.table.TakeActive();
  f.table.Cancel({{"b", 0}}, Error(ErrorKind::kStall, "stalled"));
  CHECK(!f.table.Complete(b, Status::Ok()));
  Request* c = f.Admit("c");
  f.table.TakeActive();
  f.table.Close(Error(ErrorKind::kShutdown, "bye"));
  CHECK(!f.table.Complete(c, Status::Ok()));
  const auto outcomes = f.log.Get();  // each exactly once, with the status that ended it
  CHECK_EQ(outcomes.size(), 3u);
  CHECK(outcomes.size() == 3 && outcomes[0].status.ok() && outcomes[1].status.kind == ErrorKind::kStall &&
        outcomes[2].status.kind == ErrorKind::kShutdown);
}

TEST(RequestTable, StatesFollowQueueTakeCancel) {
  Fixture f;
  Request* a0 = f.Admit("a");
  Request* a1 = f.Admit("a");
  CHECK(f.table.StateOf(a0) == RequestState::kActive);
  CHECK(f.table.StateOf(a1) == RequestState::kQueued);
  f.table.TakeActive();
  CHECK(f.table.StateOf(a0) == RequestState::kTaken);
  // A cancel round that fails nothing of `a` announces the taken front as active again.
  f.table.Cancel({}, Error(ErrorKind::kStall, "none"));
  CHECK(f.table.StateOf(a0) == RequestState::kActive);
  CHECK(f.table.StateOf(a1) == RequestState::kQueued);
}

TEST(RequestTable, NamesAreIndependent) {
  Fixture f;
  bool a_active = false, b_active = false;
  Request* a = f.Admit("a", &a_active);
  Request* b = f.Admit("b", &b_active);
  CHECK(a_active && b_active);
  CHECK_EQ(b->seq, 0u);  // numbering is per name
  CHECK_EQ(f.table.TakeActive().size(), 2u);
  f.table.Complete(b, Status::Ok());
  CHECK(f.table.Pending() == (Pending{{"a", 0}}));
  CHECK(!f.table.HasActive());  // completing b activates nothing of a
  f.table.Complete(a, Status::Ok());
  CHECK_EQ(f.log.Get().size(), 2u);
}

TEST(RequestTable, RefuseIfInFlightFailsAtOnceWithoutUsingANumber) {
  Fixture f;
  Request* first = f.Admit("a");
  RequestPtr dup = MakeRequest("a", f.log);
  dup->refuse_if_in_flight = true;
  CHECK(!f.table.Admit(std::move(dup)));
  auto outcomes = f.log.Get();
  CHECK_EQ(outcomes.size(), 1u);
  CHECK(!outcomes.empty() && outcomes[0].status.kind == ErrorKind::kDuplicate);
  CHECK(!outcomes.empty() && Contains(outcomes[0].status.message, "'a'"));
  CHECK(f.table.Pending() == (Pending{{"a", 0}}));
  f.table.Complete(first, Status::Ok());
  // Once the name is free, an explicitly named request is admitted, as number 1.
  RequestPtr again = MakeRequest("a", f.log);
  again->refuse_if_in_flight = true;
  Request* raw = again.get();
  CHECK(f.table.Admit(std::move(again)));
  CHECK_EQ(raw->seq, 1u);
}

TEST(RequestTable, CloseFailsEverythingAndRefusesLaterSubmissions) {
  Fixture f;
  f.Admit("a");
  f.Admit("a");
  f.Admit("b");
  f.table.Close(Error(ErrorKind::kShutdown, "bye"));
  CHECK(f.table.closed());
  CHECK(f.table.Pending().empty());
  CHECK(!f.table.HasActive());
  auto outcomes = f.log.Get();
  CHECK_EQ(outcomes.size(), 3u);
  for (const Outcome& o : outcomes) CHECK(o.status.kind == ErrorKind::kShutdown && o.status.message == "bye");
  bool active = true;
  f.Admit("c", &active);
  CHECK(!active);
  // A second Close keeps the first reason for later refusals.
  f.table.Close(Error(ErrorKind::kInternal, "other"));
  f.Admit("d");
  outcomes = f.log.Get();
  CHECK_EQ(outcomes.size(), 5u);
  for (const Outcome& o : outcomes) CHECK(o.status.message == "bye");
}

TEST(RequestTable, CancelFailsUpToGivenNumberAndReannouncesTheRest) {
  Fixture f;
  f.Admit("a");
  f.Admit("a");
  Request* a2 = f.Admit("a");
  Request* b0 = f.Admit("b");
  CHECK_EQ(f.table.TakeActive().size(), 2u);  // a0 and b0 were taken by the driver
  f.table.Cancel({{"a", 1}}, Error(ErrorKind::kStall, "stalled"));
  const auto outcomes = f.log.Get();
  CHECK_EQ(outcomes.size(), 2u);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    CHECK_EQ(outcomes[i].seq, i);
    CHECK(outcomes[i].status.kind == ErrorKind::kStall);
  }
  CHECK(f.table.Pending() == (Pending{{"a", 2}, {"b", 0}}) ||
        f.table.Pending() == (Pending{{"b", 0}, {"a", 2}}));
  // Every surviving front is active again, also b0 which the driver had taken.
  auto active = f.table.TakeActive();
  CHECK_EQ(active.size(), 2u);
  CHECK(std::find(active.begin(), active.end(), a2) != active.end());
  CHECK(std::find(active.begin(), active.end(), b0) != active.end());
}

TEST(RequestTable, CancelledNumbersAreRefusedWhenSubmittedLater) {
  Fixture f;
  f.Admit("c");  // c0; the other ranks were at c1 already
  f.table.Cancel({{"c", 1}}, Error(ErrorKind::kStall, "stalled"));
  bool active = true;
  f.Admit("c", &active);  // number 1: cancelled on every rank
  CHECK(!active);
  auto outcomes = f.log.Get();
  CHECK_EQ(outcomes.size(), 2u);
  CHECK(outcomes.size() == 2 && outcomes[1].seq == 1 && outcomes[1].status.kind == ErrorKind::kStall);
  CHECK(outcomes.size() == 2 && Contains(outcomes[1].status.message, "submission 1 of 'c' was cancelled"));
  Request* next = f.Admit("c", &active);  // number 2 runs
  CHECK(active);
  CHECK_EQ(next->seq, 2u);
}

TEST(RequestTable, CountStandInKeepsNumbersAlignedWithOtherRanks) {
  Fixture f;
  f.table.CountStandIn("x", 4);  // a stand-in took part in x4
  CHECK_EQ(f.Admit("x")->seq, 5u);
  f.table.CountStandIn("x", 2);  // an older number never moves the count back
  f.table.CountStandIn("x", -1);  // "the next one": 6
  CHECK_EQ(f.Admit("x")->seq, 7u);
}

TEST(RequestTable, NotifyOnlyForNewlyActiveRequestsWhenAsked) {
  Fixture f;
  const uint64_t g0 = f.wakeup.generation();
  bool active = false;
  f.Admit("a", &active, /*notify=*/false);
  CHECK(active);
  CHECK_EQ(f.wakeup.generation(), g0);
  f.Admit("a");  // queued behind a0: nothing new for the background thread
  CHECK_EQ(f.wakeup.generation(), g0);
  f.table.Close(Error(ErrorKind::kShutdown, "x"));
  CHECK(f.wakeup.generation() > g0);
}

TEST(RequestTable, WakeupWaitForSeesNewsOrTimesOut) {
  Wakeup w;
  uint64_t seen = w.generation();
  CHECK(!w.WaitFor(std::chrono::microseconds(1000), &seen));
  w.Notify();
  CHECK(w.WaitFor(std::chrono::microseconds(1000), &seen));
  CHECK_EQ(seen, w.generation());
  CHECK(!w.WaitFor(std::chrono::microseconds(0), &seen));  // the news was consumed
}

TEST(RequestTable, ExpensiveCompletionRunsOnCompletionThread) {
  Log log;
  Request* raw = nullptr;
  {
    CompletionQueue completions;
    Wakeup wakeup;
    RequestTable table(completions, wakeup);
    RequestPtr req = MakeRequest("a", log, /*cheap=*/false);
    raw = req.get();
    table.Admit(std::move(req));
    table.Complete(raw, Status::Ok());
  }  // the queue runs what it holds before it stops
  const auto outcomes = log.Get();
  CHECK_EQ(outcomes.size(), 1u);
  CHECK(outcomes.size() == 1 && outcomes[0].thread != std::this_thread::get_id());
}

TEST(RequestTable, InlineDriverCompletesItsOwnRequestOnItsThread) {
  Fixture f;
  RequestPtr req = MakeRequest("a", f.log, /*cheap=*/false);
  Request* raw = req.get();
  f.table.Admit(std::move(req), /*notify=*/false);
  InlineCompletion scope(raw);
  CHECK(InlineCompletion::For(raw) == &scope);
  CHECK(!scope.done());
  f.table.Complete(raw, Status::Ok());
  CHECK(scope.done());
  const auto outcomes = f.log.Get();  // already there: no hand-off to another thread
  CHECK(outcomes.size() == 1 && outcomes[0].thread == std::this_thread::get_id());
}

TEST(RequestTable, DestructionFailsPendingWithShutdown) {
  Log log;
  {
    CompletionQueue completions;
    Wakeup wakeup;
    RequestTable table(completions, wakeup);
    table.Admit(MakeRequest("a", log));
    table.Admit(MakeRequest("a", log));
  }
  const auto outcomes = log.Get();
  CHECK_EQ(outcomes.size(), 2u);
  for (const Outcome& o : outcomes) CHECK(o.status.kind == ErrorKind::kShutdown);
}
