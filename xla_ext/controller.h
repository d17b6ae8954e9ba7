// One negotiation cycle (see docs/control_plane.md):
//   1. every rank sets the bits of its ready cached requests and the status
//      flags, and puts the data of its small ready cached allreduces in their
//      slots; ONE allreduce gives the common hits (the small ones already
//      reduced) and the flags;
//   2. shutdown when every rank asked for it (or one gave up waiting);
//   3. a cancel round when some rank saw a fault or a stall passed the
//      shutdown bound: every rank fails the same pending submissions;
//   4. only if someone saw an invalid entry, an OR allreduce spreads the
//      invalid bits and every rank erases them;
//   5. only if someone has uncached requests, a coordinator round: gather to
//      rank 0, which matches names and broadcasts responses; after every rank
//      has decoded them (a one-word commit allreduce), every rank inserts them
//      into its cache in list order.
// While some rank has joined (join_state.h), step 1 also yields the joined set
// and joined ranks take part in the decided collectives through stand-ins.
// A cycle is a coroutine (task.h): each MPI step is a nonblocking call it
// awaits, so the thread driving the process set can serve other sets while
// this one waits. The controller refers to requests owned by the RequestTable
// and never completes them itself.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm.h"
#include "config.h"
#include "control_messages.h"
#include "cycle_message.h"
#include "fault_injection.h"
#include "join_state.h"
#include "message_table.h"
#include "request.h"
#include "request_table.h"
#include "response_cache.h"
#include "stall_inspector.h"
#include "task.h"
#include "timeline.h"

namespace jaxcache {

struct CycleOutcome {
  std::vector<Request*> done;  // reduced inside the cycle's allreduce: complete them
  // Decided: execute on every rank in the same order (Operations runs the
  // allreduces first, fused, then the others in this order).
  std::vector<Request*> work;
  std::vector<std::pair<Request*, Status>> failed;
  bool shutdown = false;
  Status shutdown_status;
  std::vector<int> never_asked;  // a forced shutdown: the ranks that never requested it
  bool progress = false;  // something was decided this cycle
};

// What this rank wants from the cycle besides its requests.
struct CycleIntent {
  bool shutdown_requested = false;  // shutdown() was called here
  bool shutdown_forced = false;     // ... and gave up waiting for the other ranks
};

class Controller {
 public:
  // `scope`: appended to messages that name ranks ("" for the global set).
  Controller(Comm& comm, const Config& config, Stats& stats, Timeline& timeline,
             RequestTable& table, FaultInjector& faults, std::string scope = "");

  // Takes a newly active request (never while a cycle is posted).
  void Add(Request* req);
  // One cycle: posts this rank's part, awaits the others, decides. The steps
  // after the cycle's allreduce involve ranks that are all in this cycle.
  Task<CycleOutcome> Cycle(CycleIntent intent);
  bool HasPending() const { return OtherPending() || join_.requested() || !rejected_.empty(); }
  bool HasFault();
  // A fault seen outside the cycle (data movement, completion): the next
  // cycle cancels every pending collective on every rank.
  void ReportFault(const std::string& what);
  std::unordered_map<std::string, uint32_t> CacheLayout() const;
  const std::string& scope() const { return scope_; }
  // Every request this controller refers to (shutdown).
  void FailAll(const Status& status, CycleOutcome* out);

 private:
  // Every flag but kShutdownRequested is stored inverted, so that the AND
  // yields "some rank has it"; kShutdownRequested's AND is "every rank has it".
  enum Flag {
    kShutdownRequested = 0, kShutdownForced, kUncached, kInvalid, kStallReport, kStallShutdown,
    kFault, kJoined, kNumFlags
  };
  enum class CancelCause { kFault, kStall };

  // The steps of a cycle, in order (Cycle runs them).
  Task<> ExchangeBits();
  void PostFlags(std::size_t cap);
  Task<> Settle(CycleOutcome* out);
  void FailRejected(CycleOutcome* out);
  Task<bool> SyncJoins(CycleOutcome* out);
  Task<> SyncInvalidations();
  void StandInForHits(CycleOutcome* out);
  void TakeHits(CycleOutcome* out);
  // A flag of the combined bits: set on some rank / on every rank.
  bool SomeRank(Flag f) const;
  bool EveryRank(Flag f) const;

  void MoveToUncached(uint32_t bit);
  // Requests other than this rank's join().
  bool OtherPending() const { return !cached_.empty() || !unsent_.empty() || !sent_.empty(); }
  // Appends a decided request to the cycle's work (or fails it when the
  // joined ranks make it impossible); `agreement` is what the ranks agreed.
  void Decide(Request* req, const std::shared_ptr<const Agreement>& agreement, CycleOutcome* out);
  // This joined rank's part in a decided collective it did not submit.
  void StandIn(const std::string& name, int64_t seq, const Signature& sig,
               const std::shared_ptr<const Agreement>& agreement, CycleOutcome* out);
  // False when some rank failed to complete the round (the commit said so).
  Task<bool> CoordinatorRound(CycleOutcome* out, bool joined_here);
  // Its steps after the broadcast: decoding (no side effects; a failure goes to
  // *fault) and, once every rank has decoded, applying the responses.
  std::vector<Response> DecodeResponses(const std::vector<char>& bytes, std::string* fault);
  void ApplyResponses(std::vector<Response>& responses, bool joined_here, CycleOutcome* out);
  // Rank 0: matches the gathered requests; returns the response message.
  std::vector<char> MatchRequests(const std::vector<std::vector<char>>& gathered);
  void InsertIntoCache(const std::string& name, const Signature& sig,
                       const std::shared_ptr<const Agreement>& agreement);
  void EraseFromCache(uint32_t bit);
  Task<> Shutdown(bool forced, bool requested_here, CycleOutcome* out);
  Task<> CancelRound(CancelCause cause);
  CancelDecision DecideCancel(const std::vector<std::vector<char>>& gathered, CancelCause cause);
  Task<> StallReport();
  void Reset();
  // Forgets every request this controller holds (the owner, RequestTable, keeps them).
  void DropRequests();
  Clock::time_point OldestPending() const;
  void PublishLayout();

  Comm& comm_;
  const Config& config_;
  Stats& stats_;
  Timeline& timeline_;
  RequestTable& table_;
  FaultInjector& faults_;
  const std::string scope_;
  ResponseCache cache_;
  CycleMessage message_;  // which bits may carry data mirrors the cache
  // The posted cycle: its intent, start, bitvector (inside message_).
  CycleIntent intent_;
  Clock::time_point cycle_start_{};
  uint64_t* bits_ = nullptr;
  bool joined_here_ = false;  // this rank has joined and posted its bits as stand-ins
  MessageTable messages_;  // used on rank 0 only
  JoinState join_;
  StallInspector stall_;
  const Comm::CycleCombine combine_;  // merges a peer's cycle message into message_
  bool eviction_warned_ = false;
  // Stall flags need the oldest pending request; scanning all of them every
  // cycle would make a cycle cost O(pending), so the scan runs a few times a second.
  Clock::time_point last_stall_scan_{};

  std::map<uint32_t, Request*> cached_;             // ready, cached: bit -> request
  std::vector<Request*> unsent_;                    // uncached, not yet sent to rank 0
  std::unordered_map<std::string, Request*> sent_;  // sent, awaiting a response
  std::vector<uint32_t> invalid_;                   // bits seen with another signature
  std::vector<Request*> rejected_;                  // submitted after this rank's join()
  std::mutex fault_mu_;
  std::string fault_;  // this rank's fault since the last cancel round

  mutable std::mutex layout_mu_;
  std::unordered_map<std::string, uint32_t> layout_;
};

}  // namespace jaxcache
