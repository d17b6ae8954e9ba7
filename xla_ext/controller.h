// One negotiation cycle (see docs/control_plane.md):
//   1. every rank sets the bits of its ready cached requests and three
//      inverted status flags; ONE bitwise-AND allreduce gives the common hits
//      and the OR of the flags;
//   2. only if someone saw an invalid entry, an OR allreduce spreads the
//      invalid bits and every rank erases them;
//   3. only if someone has uncached requests, a coordinator round: gather to
//      rank 0, which matches names and broadcasts responses; every rank
//      inserts them into its cache in list order.
// The controller runs on the background thread only.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm.h"
#include "config.h"
#include "message_table.h"
#include "request.h"
#include "response_cache.h"
#include "stall_inspector.h"
#include "timeline.h"

namespace jaxcache {

// A decided request. Its own signature is the agreed one (a cache hit matched
// it exactly; a coordinator response means every rank's was equal).
struct Work {
  RequestPtr request;
  bool queued = true;  // still waiting for its turn (timeline QUEUE phase)
  const Signature& sig() const { return request->sig; }
};

struct CycleOutcome {
  std::vector<Work> work;  // execute in this order, on every rank
  std::vector<std::pair<RequestPtr, Status>> failed;
  bool shutdown = false;
  bool progress = false;  // something was decided this cycle
};

class Controller {
 public:
  Controller(Comm& comm, const Config& config, Stats& stats, Timeline& timeline);

  void Add(RequestPtr req);
  CycleOutcome RunCycle(bool want_shutdown, const std::function<void()>& between_polls);
  bool HasPending() const { return !cached_.empty() || !unsent_.empty() || !sent_.empty(); }
  std::unordered_map<std::string, uint32_t> CacheLayout() const;
  // Fails every pending request (shutdown, stall, fatal error).
  void FailAll(const Status& status, CycleOutcome* out);

 private:
  enum Flag { kShutdown = 0, kUncached, kInvalid, kStallReport, kStallShutdown, kNumFlags };

  void MoveToUncached(uint32_t bit);
  void CoordinatorRound(CycleOutcome* out);
  void InsertIntoCache(const Response& resp);
  void HandleStall(bool shutdown, CycleOutcome* out);
  Clock::time_point OldestPending() const;
  // Stall flags need the oldest pending request; scanning all of them every
  // cycle would make a cycle cost O(pending), so the scan runs a few times a second.
  Clock::time_point last_stall_scan_{};
  void PublishLayout();

  Comm& comm_;
  const Config& config_;
  Stats& stats_;
  Timeline& timeline_;
  ResponseCache cache_;
  MessageTable table_;  // used on rank 0 only
  StallInspector stall_;
  bool eviction_warned_ = false;

  std::map<uint32_t, RequestPtr> cached_;               // ready, cached: bit -> request
  std::vector<RequestPtr> unsent_;                      // uncached, not yet sent to rank 0
  std::unordered_map<std::string, RequestPtr> sent_;    // sent, awaiting a response
  std::vector<uint32_t> invalid_;                       // bits seen with another signature

  mutable std::mutex layout_mu_;
  std::unordered_map<std::string, uint32_t> layout_;
};

}  // namespace jaxcache
