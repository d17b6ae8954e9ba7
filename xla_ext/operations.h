// Executes the decided work of one cycle: allreduce through the fusion
// buffer (small tensors) or in place (large ones), broadcast, allgather and
// barrier. Every rank executes the same list, so every rank issues the same
// MPI calls in the same order -- also after a call failed on this rank: the
// peers make the remaining calls too, so this rank makes them as well and
// fails only the requests the failed call touched.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm.h"
#include "config.h"
#include "fault_injection.h"
#include "request.h"
#include "timeline.h"

namespace jaxcache {

class Operations {
 public:
  using Complete = std::function<void(Request*, const Status&)>;
  Operations(Comm& comm, const Config& config, Stats& stats, Timeline& timeline,
             FaultInjector& faults)
      : comm_(comm), config_(config), stats_(stats), timeline_(timeline), faults_(faults) {}

  // Calls `complete` once per request, after its last MPI call. Returns a
  // description of this rank's first failure, or "" when all went well.
  std::string Execute(const std::vector<Request*>& work, const Complete& complete);

 private:
  struct Task {  // one request of the cycle
    Request* request;
    Status status;
    int remaining = 0;  // MPI calls (or fused chunks) still to run for it
    bool queued = true;  // timeline: still in its QUEUE phase
  };
  struct Item {  // one tensor of one allreduce
    std::size_t task;
    std::size_t tensor;
    int64_t count;
    std::size_t bytes;
  };
  void Allreduce(std::vector<Task>& tasks, const std::vector<std::size_t>& which);
  void FusedAllreduce(std::vector<Task>& tasks, const std::vector<Item>& items);
  void DirectAllreduce(Task& task, const Item& item);
  void BroadcastTensor(Task& task, std::size_t tensor);
  void AllgatherTensor(Task& task, std::size_t tensor);
  // Runs one MPI step for `tasks`; a failure (or an injected fault) fails them.
  template <typename Fn>
  void Step(std::vector<Task>& tasks, const std::vector<std::size_t>& touched, Fn&& fn);
  void Done(Task& task);
  void Dequeue(Task& task);
  void PhaseAll(std::vector<Task>& tasks, const std::vector<Item>& items, const char* phase, bool begin);

  Comm& comm_;
  const Config& config_;
  Stats& stats_;
  Timeline& timeline_;
  FaultInjector& faults_;
  const Complete* complete_ = nullptr;
  std::string first_failure_;
  std::vector<char> fusion_buffer_;
};

}  // namespace jaxcache
