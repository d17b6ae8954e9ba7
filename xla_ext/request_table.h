// The one owner of every request of this rank, from submission until its
// completion has run. Submitting threads admit requests; the background
// thread takes those whose turn has come and completes them.
//
// One submission per name is active at a time: a name submitted again while
// an earlier submission is in flight waits behind it. Every rank therefore
// negotiates the k-th submission of a name together with the k-th submission
// on the other ranks (its `seq`), never with another step's.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "completion_queue.h"
#include "request.h"

namespace jaxcache {

// What the background thread sleeps on: new work in any process set's table,
// or Notify() from a thread that wants it to look again.
class Wakeup {
 public:
  void Notify();
  // Sleeps until something happened after generation `*seen` (updated), or
  // `timeout` passes; true when something did.
  bool WaitFor(std::chrono::microseconds timeout, uint64_t* seen);
  uint64_t generation() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
};

// A thread driving the runtime for its own request: that request's completion
// runs on this thread (no hand-off to the completion thread), and `done` tells
// the driver it can stop.
class InlineCompletion {
 public:
  explicit InlineCompletion(const Request* request);
  ~InlineCompletion();
  bool done() const { return done_; }
  // The scope of this thread that owns `req`, or null.
  static InlineCompletion* For(const Request* req);
  void MarkDone() { done_ = true; }

 private:
  const Request* request_;
  InlineCompletion* previous_;
  bool done_ = false;
};

class RequestTable {
 public:
  // `completion_wakeups` (optional) counts how often completions handed to
  // `completions` woke its thread.
  RequestTable(CompletionQueue& completions, Wakeup& wakeup,
               std::atomic<int64_t>* completion_wakeups = nullptr)
      : completions_(completions), wakeup_(wakeup), completion_wakeups_(completion_wakeups) {}
  ~RequestTable();

  // Any thread. Takes ownership; a refused request (closed table, a refused
  // duplicate, a cancelled submission number) completes at once with the reason.
  // Returns true if the request is active at once (not queued behind its name);
  // `notify` false leaves the background thread asleep (the caller drives).
  bool Admit(RequestPtr req, bool notify = true);

  // The driver: the requests that became active since the last call.
  std::vector<Request*> TakeActive();
  // Requests are active and not yet taken.
  bool HasActive() const;
  // The requests active and not yet taken: how many, when the first was
  // submitted (a cycle time batches from there) and when the request last
  // admitted as active was submitted (a burst still arriving: runtime.cc).
  struct ActiveBurst {
    std::size_t count = 0;
    Clock::time_point first_submitted, last_submitted;
  };
  std::optional<ActiveBurst> Burst() const;

  // Background thread: completes an active or taken request (exactly once)
  // and activates the next submission of its name. A request this table does
  // not hold (completed, cancelled or closed already, or a join stand-in) is
  // left alone, without being read: false. Completing a queued request (not
  // its name's turn) is a bug: std::logic_error.
  bool Complete(Request* req, const Status& status);
  // The state of a request this table holds, or nullopt (tests, checks).
  std::optional<RequestState> StateOf(const Request* req) const;
  // Every request of this rank, active or waiting, as (name, seq).
  std::vector<std::pair<std::string, uint64_t>> Pending() const;
  // Fails every request whose seq <= upto[name] and refuses later submissions
  // of those numbers. Every other request is announced as active again: the
  // caller must have dropped its references to active requests.
  void Cancel(const std::map<std::string, uint64_t>& upto, const Status& why);
  // Fails every request and refuses later submissions with `why`.
  void Close(const Status& why);
  bool closed() const;
  // Background thread: a joined rank took part in submission `seq` of `name`
  // through a stand-in (join_state.h), or in the next one when `seq` < 0; its
  // own next submission of `name` gets the following number.
  void CountStandIn(const std::string& name, int64_t seq);

 private:
  struct NameState {
    uint64_t next_seq = 0;
    uint64_t cancelled_below = 0;  // submissions numbered below this were cancelled
    std::deque<RequestPtr> queue;  // front: the active submission
  };
  // Runs or queues a request's completion outside the lock.
  void Finish(RequestPtr req, const Status& status);

  CompletionQueue& completions_;
  Wakeup& wakeup_;
  std::atomic<int64_t>* completion_wakeups_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, NameState> names_;
  // Every request held (queued, active or taken): a pointer is looked up here
  // before it is dereferenced, so a stale one is never read.
  std::unordered_set<const Request*> held_;
  std::vector<Request*> activated_;
  Clock::time_point last_submitted_{};
  bool closed_ = false;
  Status closed_status_;
  Status cancel_status_;
};

}  // namespace jaxcache
