// Executes the decided work of one cycle: allreduce through the fusion
// buffer (small tensors) or in place (large ones), broadcast, allgather,
// reducescatter, alltoall, barrier and join. Every rank executes the same list, so every rank issues the same
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
  void ReducescatterTensor(Task& task, std::size_t tensor);
  void AlltoallTensor(Task& task, std::size_t tensor);
  // The ranks whose data counts (those that have not joined).
  int Contributors(const Request& r) const { return r.contributors ? r.contributors : comm_.size(); }
  // The prescale with the 1/contributors of an average folded in.
  double Prescale(const Request& r) const;
  // Where tensor `t`'s result goes: the caller's buffer, or one the executor
  // allocates now that the ranks have agreed on its size.
  char* Output(Request& r, std::size_t t, std::size_t bytes, std::vector<int64_t> shape);
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
  std::vector<char> scratch_;  // reducescatter's prescaled input
};

}  // namespace jaxcache
