#include "cycle_message.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "reduce_ops.h"

namespace jaxcache {

namespace {

constexpr std::size_t kEntryHeader = 8;  // [u32 bit] [u32 payload bytes]

std::size_t RoundUp8(std::size_t n) { return (n + 7) & ~std::size_t{7}; }

void CopyScaled(const void* in, void* out, int64_t count, DType dtype, double factor) {
  if (factor == 1.0) std::memcpy(out, in, count * ElementSize(dtype));
  else Scale(in, out, count, dtype, factor);
}

uint32_t EntryBit(const char* at) {
  uint32_t bit;
  std::memcpy(&bit, at, 4);
  return bit;
}

uint32_t EntryPayload(const char* at) {
  uint32_t bytes;
  std::memcpy(&bytes, at + 4, 4);
  return bytes;
}

// The size of the entry at offset `at` (< total) of a message of `total`
// bytes; an entry that runs past the end is a corrupt message.
std::size_t EntrySize(const char* msg, std::size_t at, std::size_t total) {
  const std::size_t left = total - at;
  if (left < kEntryHeader || left - kEntryHeader < EntryPayload(msg + at))
    throw std::runtime_error("jaxcache: truncated cycle message");
  return kEntryHeader + EntryPayload(msg + at);
}

}  // namespace

void CycleMessage::Assign(uint32_t bit, const Signature& sig) {
  Release(bit);
  // A reduction over the devices needs Operations' local levels (operations.h).
  if (sig.kind != Kind::kAllreduce || sig.tensors.empty() || sig.over_devices) return;
  Slot slot;
  slot.op = Reduction(sig.op);
  slot.requested = sig.op;
  slot.prescale = sig.prescale;
  slot.postscale = sig.postscale;
  std::size_t bytes = 0;
  for (const TensorSpec& t : sig.tensors) {
    slot.segments.push_back({bytes, t.NumElements(), t.dtype});
    bytes += RoundUp8(t.NumBytes());
  }
  if (bytes == 0 || bytes > kSlotBytes) return;  // too large: the data phase serves it
  slot.bytes = static_cast<uint32_t>(bytes);
  if (slots_.size() <= bit) slots_.resize(bit + 1);
  slots_[bit] = std::move(slot);
}

void CycleMessage::Release(uint32_t bit) {
  if (bit < slots_.size()) slots_[bit] = Slot();
}

void CycleMessage::ReleaseAll() { slots_.clear(); }

uint64_t* CycleMessage::Prepare(std::size_t bit_words) {
  bit_words_ = bit_words;
  const std::size_t words = max_bytes() / 8;
  if (words_.size() < words) words_.resize(words);
  std::fill_n(words_.data(), bit_words, uint64_t{0});
  bytes_ = bit_words * 8;
  results_.clear();
  return words_.data();
}

bool CycleMessage::Put(uint32_t bit, const Request& req, int size) {
  const Slot& slot = slots_[bit];
  if (bytes_ + kEntryHeader + slot.bytes > max_bytes()) return false;
  char* at = data() + bytes_;
  std::memcpy(at, &bit, 4);
  std::memcpy(at + 4, &slot.bytes, 4);
  char* payload = at + kEntryHeader;
  for (std::size_t t = 0; t < slot.segments.size(); ++t) {
    const Segment& seg = slot.segments[t];
    const double pre = ScalingOf(slot.requested, slot.prescale, slot.postscale, seg.dtype, size).pre;
    CopyScaled(req.inputs[t], payload + seg.offset, seg.count, seg.dtype, pre);
  }
  bytes_ += kEntryHeader + slot.bytes;
  return true;
}

void CycleMessage::Reduce(const Slot& slot, const char* in, char* inout) const {
  for (const Segment& seg : slot.segments)
    ReduceLocal(seg.dtype, slot.op, in + seg.offset, inout + seg.offset, seg.count);
}

std::size_t CycleMessage::Combine(char* mine, std::size_t mine_bytes, char* theirs,
                                  std::size_t theirs_bytes, bool theirs_lower) const {
  const std::size_t head = bit_words_ * 8;
  if (mine_bytes < head || theirs_bytes < head)
    throw std::runtime_error("jaxcache: truncated cycle message");
  auto* mine_bits = reinterpret_cast<uint64_t*>(mine);
  const auto* their_bits = reinterpret_cast<const uint64_t*>(theirs);
  for (std::size_t w = 0; w < bit_words_; ++w) mine_bits[w] &= their_bits[w];
  // Both lists are sorted by bit; what both hold is kept, in place (the write
  // position never passes the read position: only entries of `mine` are kept).
  std::size_t m = head, t = head, w = head;
  while (m < mine_bytes && t < theirs_bytes) {
    const std::size_t m_size = EntrySize(mine, m, mine_bytes);
    const std::size_t t_size = EntrySize(theirs, t, theirs_bytes);
    const uint32_t mb = EntryBit(mine + m), tb = EntryBit(theirs + t);
    if (mb < tb) {
      m += m_size;
      continue;
    }
    if (tb < mb) {
      t += t_size;
      continue;
    }
    if (!Eligible(mb) || m_size != t_size || m_size != kEntryHeader + slots_[mb].bytes)
      throw std::runtime_error("jaxcache: the ranks disagree on the in-cycle data of cache bit " +
                               std::to_string(mb));
    const Slot& slot = slots_[mb];
    char* mp = mine + m + kEntryHeader;
    char* tp = theirs + t + kEntryHeader;
    if (theirs_lower) {
      Reduce(slot, tp, mp);  // mine = theirs op mine
    } else {
      Reduce(slot, mp, tp);  // theirs = mine op theirs
      std::memcpy(mp, tp, slot.bytes);
    }
    if (w != m) std::memmove(mine + w, mine + m, m_size);
    w += m_size;
    m += m_size;
    t += t_size;
  }
  return w;
}

void CycleMessage::Finish() {
  results_.clear();
  for (std::size_t at = bit_words_ * 8; at < bytes_;) {
    results_.emplace_back(EntryBit(data() + at), at + kEntryHeader);
    at += kEntryHeader + EntryPayload(data() + at);
  }
}

bool CycleMessage::Take(uint32_t bit, Request& req, int size) const {
  auto it = std::lower_bound(results_.begin(), results_.end(), std::make_pair(bit, std::size_t{0}));
  if (it == results_.end() || it->first != bit) return false;
  const Slot& slot = slots_[bit];
  const char* payload = reinterpret_cast<const char*>(words_.data()) + it->second;
  for (std::size_t t = 0; t < slot.segments.size(); ++t) {
    const Segment& seg = slot.segments[t];
    const double post = ScalingOf(slot.requested, slot.prescale, slot.postscale, seg.dtype, size).post;
    CopyScaled(payload + seg.offset, req.outputs[t], seg.count, seg.dtype, post);
  }
  return true;
}

}  // namespace jaxcache
