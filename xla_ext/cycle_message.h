// The one allreduce of a cycle: the bitvector and, speculatively, the data of
// the small cached allreduces that are ready on this rank.
//
// The data rides as a sparse list of entries, one per ready request, sorted
// by bit: a message costs what is ready, not what is cached, so a step of
// 1000 per-leaf allreduces that XLA runs one after another (one ready request
// per cycle) sends one entry per cycle, not the whole cache's worth.
//
// Layout (bytes, 8-aligned): [bitvector: bit_words x u64] [entry]...
//   entry: [u32 bit] [u32 payload bytes] [payload: each tensor's data,
//   prescaled, padded to 8 bytes]
// Combining two ranks' messages ANDs the bitvectors and keeps the entries both
// hold, reduced (lower ranks' part op higher ranks' part). An entry missing on
// some rank cannot be complete, so it is dropped on the way: after the
// allreduce, the entries left are exactly the requests every rank put in,
// fully reduced, the same on every rank; they complete with no data phase.
// The others' bits still count in the AND (the data phase serves them).
//
// Which bits may carry data is decided from the cached (agreed) signature, so
// every rank decides alike; a rank puts in what fits kPayloadBytes.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common.h"
#include "request.h"

namespace jaxcache {

class CycleMessage {
 public:
  // Largest request that rides along: 16 KiB (4096 float32) still costs less in the
  // cycle than in a data call of its own (benchmarks/README.md, per-leaf E = 4096).
  static constexpr std::size_t kSlotBytes = 16384;
  // One message's entries together. 64 KiB messages were slow where ranks outnumber
  // cores (4 ranks on 2 cores, docs/control_plane.md); 32 KiB holds one largest entry.
  static constexpr std::size_t kPayloadBytes = 32768;

  // Follows the response cache, on every rank in the same order. A bit may
  // carry data if its signature is a small allreduce.
  void Assign(uint32_t bit, const Signature& sig);
  void Release(uint32_t bit);
  void ReleaseAll();
  bool Eligible(uint32_t bit) const { return bit < slots_.size() && slots_[bit].bytes != 0; }

  // Starts a message with `bit_words` zeroed words of bitvector; returns them.
  uint64_t* Prepare(std::size_t bit_words);
  // Appends `req`'s inputs, prescaled (for an average also divided by `size`:
  // the data rides in the cycle only while every rank contributes), as the
  // entry of `bit` (an eligible bit above every bit put so far). False when
  // the message has no room left for it.
  bool Put(uint32_t bit, const Request& req, int size);

  char* data() { return reinterpret_cast<char*>(words_.data()); }
  std::size_t bytes() const { return bytes_; }
  std::size_t* mutable_bytes() { return &bytes_; }
  std::size_t max_bytes() const { return bit_words_ * 8 + kPayloadBytes; }
  // Merges `theirs` (a peer's message, or several ranks' combined) into
  // `mine` in place; `theirs_lower`: theirs comes from lower ranks. Returns
  // the new size of `mine`. `theirs` is scratch (it may be overwritten).
  std::size_t Combine(char* mine, std::size_t mine_bytes, char* theirs, std::size_t theirs_bytes,
                      bool theirs_lower) const;

  // After the allreduce: indexes the entries left (every rank's data in).
  void Finish();
  // Copies the reduced data of `bit`, postscaled, to `req`'s outputs; false
  // when the bit has no complete entry in this cycle. `size`: the ranks that
  // contributed (as for Put).
  bool Take(uint32_t bit, Request& req, int size) const;

 private:
  struct Segment {
    std::size_t offset;  // bytes from the payload's start
    int64_t count;
    DType dtype;
  };
  struct Slot {
    uint32_t bytes = 0;  // payload bytes; 0: this bit carries no data
    ReduceOp op = ReduceOp::kSum;  // the operator applied (an average reduces as a sum)
    ReduceOp requested = ReduceOp::kSum;  // the signature's (ScalingOf)
    double prescale = 1.0, postscale = 1.0;
    std::vector<Segment> segments;  // one per tensor
  };
  // inout = in op inout, segment by segment.
  void Reduce(const Slot& slot, const char* in, char* inout) const;

  std::vector<Slot> slots_;  // by bit
  std::vector<uint64_t> words_;
  std::size_t bit_words_ = 0;
  std::size_t bytes_ = 0;  // used bytes of the message
  std::vector<std::pair<uint32_t, std::size_t>> results_;  // bit -> payload offset
};

}  // namespace jaxcache
