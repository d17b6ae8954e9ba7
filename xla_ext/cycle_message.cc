#include "cycle_message.h"

#include <algorithm>
#include <cstring>

#include "reduce_ops.h"

namespace jaxcache {

namespace {

constexpr std::size_t kHeaderWords = 2;  // [total words] [bit words | segments << 32]
constexpr std::size_t kSegmentWords = 2;  // [offset | dtype << 32 | op << 40] [count]

std::size_t RoundUp8(std::size_t n) { return (n + 7) & ~std::size_t{7}; }

void CopyScaled(const void* in, void* out, int64_t count, DType dtype, double factor) {
  if (factor == 1.0) std::memcpy(out, in, count * ElementSize(dtype));
  else Scale(in, out, count, dtype, factor);
}

// The cycle's MPI operator (see cycle_message.h for the layout it reads).
void CycleReduce(void* invec, void* inoutvec, int* len, MPI_Datatype*) {
  auto* in = static_cast<const uint64_t*>(invec);
  auto* inout = static_cast<uint64_t*>(inoutvec);
  for (int element = 0; element < *len; ++element) {
    const std::size_t total = in[0];
    const std::size_t bit_words = in[1] & 0xffffffffu;
    const std::size_t segments = in[1] >> 32;
    const uint64_t* table = in + kHeaderWords;
    const std::size_t bits_at = kHeaderWords + kSegmentWords * segments;
    for (std::size_t w = 0; w < bit_words; ++w) inout[bits_at + w] &= in[bits_at + w];
    const char* region_in = reinterpret_cast<const char*>(in + bits_at + bit_words);
    char* region_inout = reinterpret_cast<char*>(inout + bits_at + bit_words);
    for (std::size_t s = 0; s < segments; ++s) {
      const uint64_t desc = table[kSegmentWords * s];
      const std::size_t offset = desc & 0xffffffffu;
      const auto dtype = static_cast<DType>((desc >> 32) & 0xff);
      const auto op = static_cast<ReduceOp>((desc >> 40) & 0xff);
      const auto count = static_cast<int64_t>(table[kSegmentWords * s + 1]);
      ReduceLocal(dtype, op, region_in + offset, region_inout + offset, count);
    }
    in += total;
    inout += total;
  }
}

}  // namespace

CycleMessage::~CycleMessage() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (type_ != MPI_DATATYPE_NULL && !finalized) MPI_Type_free(&type_);
}

MPI_Op CycleMessage::op() {
  static const MPI_Op op = [] {
    MPI_Op created;
    MPI_Op_create(&CycleReduce, /*commute=*/1, &created);
    return created;
  }();
  return op;
}

std::size_t CycleMessage::RegionUsed() const {
  std::size_t end = 0;
  for (const auto& [bit, slot] : slots_) end = std::max(end, slot.offset + slot.bytes);
  return end;
}

void CycleMessage::Assign(uint32_t bit, const Signature& sig) {
  Release(bit);
  if (sig.kind != Kind::kAllreduce || sig.tensors.empty()) return;
  Slot slot{0, 0, Reduction(sig.op), sig.op == ReduceOp::kAverage, sig.prescale, sig.postscale, {}};
  for (const TensorSpec& t : sig.tensors) {
    slot.segments.push_back({slot.bytes, t.NumElements(), t.dtype});
    slot.bytes += RoundUp8(t.NumBytes());
  }
  if (slot.bytes == 0 || slot.bytes > kSlotBytes) return;
  // First fit, by offset: deterministic, so every rank finds the same place.
  std::vector<std::pair<std::size_t, std::size_t>> used;  // [offset, end)
  for (const auto& [b, s] : slots_) used.emplace_back(s.offset, s.offset + s.bytes);
  std::sort(used.begin(), used.end());
  std::size_t at = 0;
  for (const auto& [begin, end] : used) {
    if (begin >= at && begin - at >= slot.bytes) break;
    at = std::max(at, end);
  }
  if (at + slot.bytes > kRegionBytes) return;  // full: this one takes the data phase
  slot.offset = at;
  for (Segment& seg : slot.segments) seg.offset += at;
  slots_.emplace(bit, std::move(slot));
}

void CycleMessage::Release(uint32_t bit) { slots_.erase(bit); }

void CycleMessage::ReleaseAll() { slots_.clear(); }

char* CycleMessage::Region() { return reinterpret_cast<char*>(words_.data() + region_word_); }
const char* CycleMessage::Region() const {
  return reinterpret_cast<const char*>(words_.data() + region_word_);
}

uint64_t* CycleMessage::Prepare(std::size_t bit_words) {
  std::size_t segments = 0;
  for (const auto& [bit, slot] : slots_) segments += slot.segments.size();
  const std::size_t bits_at = kHeaderWords + kSegmentWords * segments;
  region_word_ = bits_at + bit_words;
  const std::size_t region_bytes = RegionUsed();
  const std::size_t total = region_word_ + region_bytes / 8;
  words_.assign(total, 0);
  words_[0] = total;
  words_[1] = bit_words | (static_cast<uint64_t>(segments) << 32);
  uint64_t* table = words_.data() + kHeaderWords;
  for (const auto& [bit, slot] : slots_) {
    for (const Segment& seg : slot.segments) {
      table[0] = seg.offset | (static_cast<uint64_t>(seg.dtype) << 32) |
                 (static_cast<uint64_t>(slot.op) << 40);
      table[1] = static_cast<uint64_t>(seg.count);
      table += kSegmentWords;
    }
  }
  return words_.data() + bits_at;
}

void CycleMessage::Put(uint32_t bit, const Request& req, int size) {
  const Slot& slot = slots_.at(bit);
  const double factor = slot.average ? slot.prescale / size : slot.prescale;
  for (std::size_t t = 0; t < slot.segments.size(); ++t) {
    const Segment& seg = slot.segments[t];
    CopyScaled(req.inputs[t], Region() + seg.offset, seg.count, seg.dtype, factor);
  }
}

void CycleMessage::Take(uint32_t bit, Request& req) const {
  const Slot& slot = slots_.at(bit);
  for (std::size_t t = 0; t < slot.segments.size(); ++t) {
    const Segment& seg = slot.segments[t];
    CopyScaled(Region() + seg.offset, req.outputs[t], seg.count, seg.dtype, slot.postscale);
  }
}

MPI_Datatype CycleMessage::datatype() {
  if (type_ == MPI_DATATYPE_NULL || type_words_ != words_.size()) {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
    MPI_Type_contiguous(static_cast<int>(words_.size()), MPI_UINT64_T, &type_);
    MPI_Type_commit(&type_);
    type_words_ = words_.size();
  }
  return type_;
}

}  // namespace jaxcache
