// One process set: the ranks that negotiate and move data together. Each has
// its own duplicate of the communicator, request table (names are matched
// within the set), controller (response cache, cycle message, coordinator =
// the set's lowest rank), executor and counters. The set with id 0 is the
// whole job. The runtime drives every set's cycles (runtime.h).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm.h"
#include "config.h"
#include "controller.h"
#include "fault_injection.h"
#include "operations.h"
#include "point_to_point.h"
#include "request_table.h"
#include "task.h"
#include "timeline.h"

namespace jaxcache {

class ProcessSet {
 public:
  // `global_ranks`: the members' ranks in the whole job, in set-rank order
  // (empty for the global set); error messages name both numberings.
  ProcessSet(int32_t id, MPI_Comm comm, const std::vector<int>& global_ranks, const Config& config,
             const Timeline& timeline, FaultInjector& faults, CompletionQueue& completions,
             Wakeup& wakeup, const std::atomic<bool>* abandon);

  int32_t id() const { return id_; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  Comm& comm() { return *comm_; }
  // Its point-to-point channels (any thread: MPI calls on them need no driver).
  const P2PChannels& p2p() const { return *p2p_; }
  const Comm& comm() const { return *comm_; }
  RequestTable& table() { return table_; }
  Stats& stats() { return stats_; }
  std::unordered_map<std::string, uint32_t> CacheLayout() const { return controller_->CacheLayout(); }
  void ReportFault(const std::string& what) { controller_->ReportFault(what); }

  // Held by whichever thread drives this set's cycles.
  std::mutex& driver() { return driver_; }

  // --- under driver() -------------------------------------------------------
  // Starts a cycle, or resumes the one in flight once its MPI step completed.
  // True when a cycle finished (its outcome has run).
  bool Advance(const CycleIntent& intent);
  bool cycle_in_flight() const { return cycle_.valid(); }
  // The cycle in flight waits for data moving between ranks that are all in
  // the same step: worth polling without sleeping.
  bool transferring() const { return comm_->parked() && comm_->parked_on() == Comm::Wait::kTransfer; }
  // When the MPI step it waits for was posted.
  Clock::time_point parked_since() const { return comm_->parked_since(); }
  // This rank has something for the next cycle.
  bool HasWork();
  Clock::time_point last_cycle() const { return last_cycle_; }
  bool last_progress() const { return progress_; }
  // Its next cycle is held for a burst of requests still arriving (runtime.cc).
  bool holding_burst = false;

  // --- any thread -----------------------------------------------------------
  // The set has stopped (shutdown, removal): its requests have failed.
  bool stopped() const { return stopped_; }
  // Why it stopped.
  std::string closing_message() const;
  // The members that never asked for the stop that closed the set (forced).
  std::vector<int> closed_without() const;
  // Removal asked here (remove_process_set); with `forced`, stop without the
  // members that have not asked.
  std::atomic<bool> remove_requested{false}, remove_forced{false};

 private:
  Task<> RunCycle(CycleIntent intent);
  void Complete(Request* req, const Status& status);

  const int32_t id_;
  const std::vector<int> global_ranks_;
  const Config& config_;
  Timeline timeline_;
  FaultInjector& faults_;
  CompletionQueue& completions_;
  Stats stats_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<P2PChannels> p2p_;
  RequestTable table_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Operations> operations_;
  std::mutex driver_;
  Task<> cycle_;
  Clock::time_point last_cycle_{};
  bool progress_ = true;
  std::atomic<bool> stopped_{false};
  mutable std::mutex closing_mu_;
  std::string closing_message_;
  std::vector<int> closed_without_;
};

}  // namespace jaxcache
