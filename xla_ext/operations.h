// Executes the decided work of one cycle: allreduce through the fusion
// buffer (small tensors) or in place (large ones), broadcast and allgather.
// Every rank executes the same list, so every rank issues the same MPI calls
// in the same order.
#pragma once

#include <functional>
#include <vector>

#include "comm.h"
#include "config.h"
#include "controller.h"
#include "timeline.h"

namespace jaxcache {

class Operations {
 public:
  using Complete = std::function<void(RequestPtr, Status)>;
  Operations(Comm& comm, const Config& config, Stats& stats, Timeline& timeline)
      : comm_(comm), config_(config), stats_(stats), timeline_(timeline) {}

  void Execute(std::vector<Work>& work, const Complete& complete);

 private:
  struct Item {  // one tensor of one allreduce response
    std::size_t work;
    std::size_t tensor;
    int64_t count;
    std::size_t bytes;
  };
  void Allreduce(std::vector<Work>& work, const std::vector<std::size_t>& which,
                 std::vector<int>* remaining, const Complete& complete);
  // Reduces one chunk of small tensors through the fusion buffer.
  void FusedAllreduce(std::vector<Work>& work, const std::vector<Item>& items);
  void DirectAllreduce(Work& w, const Item& item);
  void Broadcast(Work& w);
  // Marks the end of a request's wait between negotiation and execution.
  void Dequeue(Work& w);
  // Phase on the track of every request in a fused chunk.
  void PhaseAll(std::vector<Work>& work, const std::vector<Item>& items, const char* phase, bool begin);
  void Allgather(Work& w);

  Comm& comm_;
  const Config& config_;
  Stats& stats_;
  Timeline& timeline_;
  std::vector<char> fusion_buffer_;
};

}  // namespace jaxcache
