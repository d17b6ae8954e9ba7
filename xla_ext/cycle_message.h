// The one allreduce of a cycle: the bitvector and, speculatively, the data of
// small cached allreduces that are ready on this rank.
//
// Every small cached allreduce (at most kSlotBytes) owns a slot in a region of
// the message, assigned when it enters the response cache -- so the layout is
// the same on every rank, like the bit positions. A rank copies the (prescaled)
// data of its ready slotted requests into their slots; one user-defined MPI
// operator ANDs the bitvector and reduces each slot with its own dtype and op.
// When the AND shows a slotted request ready on every rank, every rank put its
// data in, so the slot holds the result: the request completes without a data
// phase. Otherwise the slot's result is ignored.
//
// Message layout (64-bit words): [header: word count, bit words, segment count]
// [segments: offset, count, dtype, op] [bitvector] [region]. The header travels
// in the message because MPI operators get no context argument; it is identical
// on every rank, so the operator reads it from either input.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "common.h"
#include "request.h"

namespace jaxcache {

class CycleMessage {
 public:
  static constexpr std::size_t kSlotBytes = 4096;    // largest request that rides along
  static constexpr std::size_t kRegionBytes = 16384;  // all slots together

  CycleMessage() = default;
  ~CycleMessage();
  CycleMessage(const CycleMessage&) = delete;
  CycleMessage& operator=(const CycleMessage&) = delete;

  // Slots follow the response cache, on every rank in the same order.
  // A bit gets a slot if its signature is a small allreduce and space is left.
  void Assign(uint32_t bit, const Signature& sig);
  void Release(uint32_t bit);
  void ReleaseAll();
  bool HasSlot(uint32_t bit) const { return slots_.count(bit) != 0; }

  // Lays out a message for `bit_words` words of bitvector and the current slots;
  // returns the bitvector to fill (zeroed). The region starts zeroed too.
  uint64_t* Prepare(std::size_t bit_words);
  // Copies `req`'s inputs, prescaled (for an average also divided by `size`:
  // the data rides in the cycle only while every rank contributes), into its slot.
  void Put(uint32_t bit, const Request& req, int size);
  // After the reduction: copies the slot's result, postscaled, to `req`'s outputs.
  void Take(uint32_t bit, Request& req) const;

  void* data() { return words_.data(); }
  MPI_Datatype datatype();  // one element: the whole message
  static MPI_Op op();       // AND of the bitvector, per-segment reduction of the region

 private:
  struct Segment {
    std::size_t offset;  // bytes from the region's start
    int64_t count;
    DType dtype;
  };
  struct Slot {
    std::size_t offset, bytes;
    ReduceOp op;  // the operator MPI would apply (an average reduces as a sum)
    bool average;
    double prescale, postscale;
    std::vector<Segment> segments;  // one per tensor
  };
  std::size_t RegionUsed() const;
  char* Region();
  const char* Region() const;

  std::map<uint32_t, Slot> slots_;
  std::vector<uint64_t> words_;
  std::size_t region_word_ = 0;  // first word of the region
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  std::size_t type_words_ = 0;
};

}  // namespace jaxcache
