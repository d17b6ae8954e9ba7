// CycleMessage: which bits carry data, the message layout, the combination
// the cycle's allreduce applies between ranks, and the checks on what it
// receives.
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "check.h"
#include "cycle_message.h"

using namespace jaxcache;

namespace {

Signature Allreduce(std::vector<TensorSpec> tensors, ReduceOp op = ReduceOp::kSum) {
  Signature s;
  s.op = op;
  s.tensors = std::move(tensors);
  return s;
}

Signature Floats(int64_t n, ReduceOp op = ReduceOp::kSum) {
  return Allreduce({{DType::kFloat32, {n}}}, op);
}

// A request reading `in` and writing `out` (one float32 tensor).
Request FloatRequest(const std::vector<float>& in, std::vector<float>* out = nullptr) {
  Request req;
  req.inputs.push_back(in.data());
  req.outputs.push_back(out ? out->data() : nullptr);
  return req;
}

// The cycle's allreduce between two ranks: each combines the other's bytes
// into its own message, then indexes what is left.
void Exchange(CycleMessage& lower, CycleMessage& higher) {
  std::vector<char> from_lower(lower.data(), lower.data() + lower.bytes());
  std::vector<char> from_higher(higher.data(), higher.data() + higher.bytes());
  *lower.mutable_bytes() =
      lower.Combine(lower.data(), lower.bytes(), from_higher.data(), from_higher.size(), false);
  *higher.mutable_bytes() =
      higher.Combine(higher.data(), higher.bytes(), from_lower.data(), from_lower.size(), true);
  lower.Finish();
  higher.Finish();
}

bool SameBytes(CycleMessage& a, CycleMessage& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

uint32_t U32At(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Both ranks assign the same bits (they follow the same response cache).
void AssignBoth(CycleMessage& a, CycleMessage& b, uint32_t bit, const Signature& sig) {
  a.Assign(bit, sig);
  b.Assign(bit, sig);
}

}  // namespace

TEST(CycleMessage, OnlySmallAllreducesCarryData) {
  CycleMessage msg;
  msg.Assign(0, Floats(4));
  CHECK(msg.Eligible(0));
  constexpr int64_t kSlotFloats = CycleMessage::kSlotBytes / sizeof(float);
  msg.Assign(1, Floats(kSlotFloats + 1));  // more than a slot
  CHECK(!msg.Eligible(1));
  msg.Assign(2, Floats(kSlotFloats));  // exactly a slot
  CHECK(msg.Eligible(2));
  Signature bcast = Floats(4);
  bcast.kind = Kind::kBroadcast;
  msg.Assign(3, bcast);
  CHECK(!msg.Eligible(3));
  Signature barrier;
  barrier.kind = Kind::kBarrier;
  msg.Assign(4, barrier);
  CHECK(!msg.Eligible(4));
  CHECK(!msg.Eligible(1000));  // never assigned
  msg.Assign(0, bcast);  // a bit reused by another entry loses its slot
  CHECK(!msg.Eligible(0));
  msg.Release(2);
  CHECK(!msg.Eligible(2));
  msg.Assign(2, Floats(4));
  msg.ReleaseAll();
  CHECK(!msg.Eligible(2));
}

TEST(CycleMessage, PrepareStartsWithZeroedBitvector) {
  CycleMessage msg;
  uint64_t* words = msg.Prepare(2);
  words[0] = words[1] = ~uint64_t{0};
  words = msg.Prepare(2);
  CHECK_EQ(words[0], 0u);
  CHECK_EQ(words[1], 0u);
  CHECK_EQ(msg.bytes(), 16u);
  CHECK_EQ(msg.max_bytes(), 16u + CycleMessage::kPayloadBytes);
}

TEST(CycleMessage, EntryLayoutIsBitThenPaddedPayload) {
  CycleMessage msg;
  msg.Assign(5, Floats(3));  // 12 bytes, padded to 16
  msg.Prepare(1);
  const std::vector<float> in = {1, 2, 3};
  CHECK(msg.Put(5, FloatRequest(in), 1));
  CHECK_EQ(msg.bytes(), 8u + 8u + 16u);
  const char* entry = msg.data() + 8;
  CHECK_EQ(U32At(entry), 5u);
  CHECK_EQ(U32At(entry + 4), 16u);
  float payload[3];
  std::memcpy(payload, entry + 8, sizeof payload);
  CHECK(payload[0] == 1 && payload[1] == 2 && payload[2] == 3);
}

TEST(CycleMessage, SingleRankRoundTripAppliesPreAndPostscale) {
  CycleMessage msg;
  Signature sig = Floats(3);
  sig.prescale = 2.0;
  sig.postscale = 3.0;
  msg.Assign(1, sig);
  msg.Prepare(1);
  const std::vector<float> in = {1, -2, 0.5f};
  std::vector<float> out(3, 0);
  Request req = FloatRequest(in, &out);
  CHECK(msg.Put(1, req, 1));
  msg.Finish();
  CHECK(msg.Take(1, req, 1));
  CHECK(out == (std::vector<float>{6, -12, 3}));
  CHECK(in == (std::vector<float>{1, -2, 0.5f}));  // inputs are left alone
  CHECK(!msg.Take(0, req, 1));  // no entry for bit 0 in this cycle
}

TEST(CycleMessage, SeveralTensorsOfMixedDtypesRoundTrip) {
  CycleMessage msg;
  msg.Assign(0, Allreduce({{DType::kInt32, {3}}, {DType::kFloat64, {2}}, {DType::kInt8, {5}}}));
  msg.Prepare(1);
  const int32_t a[3] = {7, 8, 9};
  const double b[2] = {0.25, -4};
  const int8_t c[5] = {1, 2, 3, 4, 5};
  int32_t a_out[3] = {};
  double b_out[2] = {};
  int8_t c_out[5] = {};
  Request req;
  req.inputs = {a, b, c};
  req.outputs = {a_out, b_out, c_out};
  CHECK(msg.Put(0, req, 1));
  CHECK_EQ(msg.bytes(), 8u + 8u + 16u + 16u + 8u);  // each tensor padded to 8 bytes
  msg.Finish();
  CHECK(msg.Take(0, req, 1));
  CHECK(std::memcmp(a, a_out, sizeof a) == 0);
  CHECK(std::memcmp(b, b_out, sizeof b) == 0);
  CHECK(std::memcmp(c, c_out, sizeof c) == 0);
}

TEST(CycleMessage, CombineKeepsOnlyEntriesEveryRankHoldsReduced) {
  CycleMessage r0, r1;
  for (uint32_t bit : {1u, 2u, 3u, 5u}) AssignBoth(r0, r1, bit, Floats(2));
  const std::vector<float> a = {1, 2}, b = {10, 20};
  // Rank 0 has bits 1, 2 and 5 ready; rank 1 has 2 and 3.
  r0.Prepare(1)[0] = 0b100110;
  for (uint32_t bit : {1u, 2u, 5u}) r0.Put(bit, FloatRequest(a), 2);
  r1.Prepare(1)[0] = 0b001100;
  for (uint32_t bit : {2u, 3u}) r1.Put(bit, FloatRequest(b), 2);
  Exchange(r0, r1);
  CHECK(SameBytes(r0, r1));  // every rank ends with the same message
  CHECK_EQ(reinterpret_cast<uint64_t*>(r0.data())[0], 0b000100u);
  CHECK_EQ(r0.bytes(), 8u + 8u + 8u);  // one entry left
  std::vector<float> out(2, 0);
  Request req = FloatRequest(a, &out);
  for (uint32_t bit : {1u, 3u, 5u}) CHECK(!r0.Take(bit, req, 2));
  CHECK(r0.Take(2, req, 2));
  CHECK(out == (std::vector<float>{11, 22}));
}

TEST(CycleMessage, AverageDividesByRanksAndReducesWithTheOp) {
  CycleMessage r0, r1;
  AssignBoth(r0, r1, 0, Floats(2, ReduceOp::kAverage));
  AssignBoth(r0, r1, 1, Floats(2, ReduceOp::kMin));
  AssignBoth(r0, r1, 2, Allreduce({{DType::kInt64, {2}}}, ReduceOp::kProd));
  const std::vector<float> a = {1, 8}, b = {3, -8};
  const int64_t ia[2] = {3, -2}, ib[2] = {5, 7};
  Request pa, pb;
  pa.inputs = {ia};
  pb.inputs = {ib};
  for (CycleMessage* m : {&r0, &r1}) m->Prepare(1)[0] = 0b111;
  r0.Put(0, FloatRequest(a), 2);
  r0.Put(1, FloatRequest(a), 2);
  r0.Put(2, pa, 2);
  r1.Put(0, FloatRequest(b), 2);
  r1.Put(1, FloatRequest(b), 2);
  r1.Put(2, pb, 2);
  Exchange(r0, r1);
  CHECK(SameBytes(r0, r1));
  std::vector<float> out(2, 0);
  Request req = FloatRequest(a, &out);
  CHECK(r1.Take(0, req, 2));
  CHECK(out == (std::vector<float>{2, 0}));
  CHECK(r1.Take(1, req, 2));
  CHECK(out == (std::vector<float>{1, -8}));
  int64_t prod[2] = {};
  pa.outputs = {prod};
  CHECK(r1.Take(2, pa, 2));
  CHECK(prod[0] == 15 && prod[1] == -14);
}

TEST(CycleMessage, ThreeRanksFoldToTheSameResult) {
  CycleMessage r[3];
  for (CycleMessage& m : r) m.Assign(0, Floats(1));
  const std::vector<float> in[3] = {{1}, {2}, {4}};
  for (int i = 0; i < 3; ++i) {
    r[i].Prepare(1)[0] = 1;
    r[i].Put(0, FloatRequest(in[i]), 3);
  }
  Exchange(r[0], r[1]);  // r0 and r1 now hold 1 + 2
  Exchange(r[1], r[2]);
  CHECK(SameBytes(r[1], r[2]));
  std::vector<float> out(1, 0);
  Request req = FloatRequest(in[0], &out);
  CHECK(r[2].Take(0, req, 3));
  CHECK_EQ(out[0], 7.0f);
}

TEST(CycleMessage, PutRefusesWhatNoLongerFits) {
  // Entries of the largest request that rides along: as many as kPayloadBytes holds, then no more.
  constexpr std::size_t kFloats = CycleMessage::kSlotBytes / sizeof(float);
  constexpr std::size_t kFit = CycleMessage::kPayloadBytes / (CycleMessage::kSlotBytes + 8);
  static_assert(kFit >= 1, "a message holds at least one entry of the largest slot");
  CycleMessage msg;
  for (uint32_t bit = 0; bit <= kFit; ++bit) msg.Assign(bit, Floats(kFloats));
  msg.Prepare(1);
  const std::vector<float> in(kFloats, 1.0f);
  for (uint32_t bit = 0; bit < kFit; ++bit) CHECK(msg.Put(bit, FloatRequest(in), 1));
  const std::size_t full = msg.bytes();
  CHECK(!msg.Put(kFit, FloatRequest(in), 1));  // (kFit + 1) x (kSlotBytes + 8) > kPayloadBytes
  CHECK_EQ(msg.bytes(), full);
  CHECK(msg.bytes() <= msg.max_bytes());
}

TEST(CycleMessage, CombineRejectsMessageShorterThanBitvector) {
  CycleMessage msg;
  msg.Prepare(2);
  std::vector<char> theirs(15, 0);  // one byte short of two words
  CHECK_THROWS(msg.Combine(msg.data(), msg.bytes(), theirs.data(), theirs.size(), true));
  std::vector<char> full(16, 0);
  CHECK_THROWS(msg.Combine(msg.data(), 8, full.data(), full.size(), true));
  CHECK_EQ(msg.Combine(msg.data(), msg.bytes(), full.data(), full.size(), true), 16u);
}

TEST(CycleMessage, CombineRejectsEntriesTheRanksDisagreeOn) {
  const std::vector<float> in(4, 1.0f);
  // One message of bit 0 with `n` floats, from a rank where bit 0 is `eligible`.
  auto message = [&](CycleMessage& m, int64_t n, bool eligible) {
    m.Assign(0, Floats(n));
    m.Prepare(1)[0] = 1;
    m.Put(0, FloatRequest(in), 2);
    if (!eligible) m.Release(0);
  };
  CycleMessage r0, r1;
  message(r0, 2, true);
  message(r1, 4, true);  // a different cached signature: another payload size
  std::vector<char> theirs(r1.data(), r1.data() + r1.bytes());
  CHECK_THROWS(r0.Combine(r0.data(), r0.bytes(), theirs.data(), theirs.size(), false));
  // The same entry on both, but this rank has no slot for the bit.
  CycleMessage r2, r3;
  message(r2, 2, false);
  message(r3, 2, true);
  std::vector<char> same(r3.data(), r3.data() + r3.bytes());
  CHECK_THROWS(r2.Combine(r2.data(), r2.bytes(), same.data(), same.size(), false));
  // And the agreeing pair combines fine.
  CycleMessage r4;
  message(r4, 2, true);
  std::vector<char> fine(r3.data(), r3.data() + r3.bytes());
  CHECK_EQ(r4.Combine(r4.data(), r4.bytes(), fine.data(), fine.size(), false), r4.bytes());
}

TEST(CycleMessage, CombineRejectsEntriesThatRunPastTheMessage) {
  const std::vector<float> in(4, 1.0f);
  CycleMessage mine, other;
  for (CycleMessage* m : {&mine, &other}) {
    m->Assign(0, Floats(4));
    m->Prepare(1)[0] = 1;
    m->Put(0, FloatRequest(in), 2);
  }
  const std::vector<char> whole(other.data(), other.data() + other.bytes());
  // Cut inside the entry's header, then inside its payload: each is refused, not read past
  // (an exact-size copy, so the sanitizer build sees any read beyond it).
  const std::size_t entry = 8;  // after one word of bits
  for (std::size_t cut : {entry + 4, whole.size() - 4}) {
    std::vector<char> theirs(whole.begin(), whole.begin() + cut);
    CHECK_THROWS(mine.Combine(mine.data(), mine.bytes(), theirs.data(), theirs.size(), false));
  }
  // A payload length that claims more than the message holds.
  std::vector<char> lying(whole);
  const uint32_t huge = 1u << 20;
  std::memcpy(lying.data() + entry + 4, &huge, 4);
  CHECK_THROWS(mine.Combine(mine.data(), mine.bytes(), lying.data(), lying.size(), false));
}
