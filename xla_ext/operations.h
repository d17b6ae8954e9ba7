// Executes the decided work of one cycle: allreduces together, through the
// fusion buffer (small tensors) or in place (large ones); every other request
// tensor by tensor, by its collective's Execute (collectives/). Every rank executes the same
// list, so every rank issues the same MPI calls in the same order -- also
// after a call failed on this rank: the peers make the remaining calls too, so
// this rank makes them as well and fails only the requests the failed call
// touched. Execution is a coroutine: every MPI call is awaited (comm.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm.h"
#include "config.h"
#include "fault_injection.h"
#include "request.h"
#include "task.h"
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
  Task<std::string> Execute(const std::vector<Request*>& work, Complete complete);

  // --- for the collectives' Execute (collectives/*.cc) ---
  Comm& comm() { return comm_; }
  Stats& stats() { return stats_; }
  // The ranks whose data counts (those that have not joined).
  int Contributors(const Request& r) const { return r.contributors ? r.contributors : comm_.size(); }
  // What an average divides by: the set's size, or with JAXCACHE_JOIN_AVERAGE_BY_SIZE=0
  // the ranks that have not joined.
  int AverageDivisor(const Request& r) const {
    return config_.join_average_by_size ? comm_.size() : Contributors(r);
  }
  // The factors tensor `t` of `r` is reduced with (ScalingOf: 1/AverageDivisor of an
  // average folded in).
  Scaling ScalingFor(const Request& r, std::size_t t) const;
  // Where tensor `t`'s result goes: the caller's buffer, or one the executor
  // allocates now that the ranks have agreed on its size.
  char* Output(Request& r, std::size_t t, std::size_t bytes, std::vector<int64_t> shape);
  // At least `bytes` of scratch memory, kept between cycles (contents not).
  char* Scratch(std::size_t bytes);

 private:
  struct Job {  // one request of the cycle
    Request* request;
    Status status;
    int remaining = 0;  // MPI calls (or fused chunks) still to run for it
    bool queued = true;  // timeline: still in its QUEUE phase
  };
  struct Item {  // one tensor of one allreduce, or one device's block of one (device_reduction.h)
    std::size_t job;
    std::size_t tensor;
    int64_t count;
    std::size_t bytes;
    const void* in;  // where its elements are read
    void* out;       // where their reduction goes
    bool block = false;  // reduced in place in the device's result, after ReduceBlocks
  };
  // The items of one allreduce job into `items`: its tensors, or over the devices each
  // device's block (after ReduceBlocks).
  void ItemsOf(std::vector<Job>& jobs, std::size_t job, std::vector<Item>& items);
  Task<> Allreduce(std::vector<Job>& jobs, const std::vector<std::size_t>& which);
  struct AllreducePlan {
    std::vector<std::vector<Item>> chunks;  // fused, each one reduction
    std::vector<Item> direct;               // reduced on their own
  };
  AllreducePlan PlanAllreduce(std::vector<Job>& jobs, const std::vector<std::size_t>& which);
  void AppendChunks(std::vector<Job>& jobs, const std::vector<Item>& items, std::vector<std::vector<Item>>* chunks);
  Task<> FusedAllreduce(std::vector<Job>& jobs, const std::vector<Item>& items);
  Task<> DirectAllreduce(Job& job, const Item& item);
  // A device's block reduced across the processes in its result buffer.
  Task<> BlockAllreduce(Request& r, const Item& item);
  // Bytes from which an allreduce tensor is reduced on its own (JAXCACHE_DIRECT_THRESHOLD).
  int64_t DirectThreshold() const;
  // Runs one MPI step for the `touched` jobs; a failure (or an injected fault)
  // fails them.
  Task<> Step(std::vector<Job>& jobs, std::vector<std::size_t> touched, std::function<Task<>()> step);
  void Done(Job& job);
  void Dequeue(Job& job);
  void PhaseAll(std::vector<Job>& jobs, const std::vector<Item>& items, const char* phase, bool begin);

  Comm& comm_;
  const Config& config_;
  Stats& stats_;
  Timeline& timeline_;
  FaultInjector& faults_;
  Complete complete_;
  std::string first_failure_;
  std::vector<char> fusion_buffer_;
  std::vector<Item> items_;  // one job's, reused (no allocation per request and cycle)
  std::vector<char> scratch_;
};

// Copies `count` elements from `in` to `out` multiplied by `factor` (a plain
// copy, none when in == out, for 1).
void CopyScaled(const void* in, void* out, int64_t count, DType dtype, double factor);
// Asks for transparent huge pages for the whole 2 MiB pages of a large result
// buffer before its first touch (see operations.cc).
void AdviseHugePages(void* p, std::size_t bytes);
// The shape of `rows` rows of a tensor shaped like `spec` (a scalar's rows form a vector).
std::vector<int64_t> WithRows(const TensorSpec& spec, int64_t rows);

}  // namespace jaxcache
