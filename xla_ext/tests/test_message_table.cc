// MessageTable: rank 0 matches submissions by (name, number), decides them
// once every rank (or a joined stand-in) is in, and names what differs.
#include <optional>
#include <string>
#include <vector>

#include "check.h"
#include "message_table.h"

using namespace jaxcache;

namespace {

Signature Sig(Kind kind, DType dtype, std::vector<int64_t> shape) {
  Signature s;
  s.kind = kind;
  s.tensors.push_back({dtype, std::move(shape)});
  return s;
}

Signature Allreduce(std::vector<int64_t> shape = {4}, DType dtype = DType::kFloat32) {
  return Sig(Kind::kAllreduce, dtype, std::move(shape));
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Decides one submission from `sigs` (one per rank) and returns the response.
Response DecideAll(const std::vector<Signature>& sigs) {
  std::vector<const Signature*> by_rank;
  for (const Signature& s : sigs) by_rank.push_back(&s);
  return MessageTable::Decide("t", 0, by_rank);
}

}  // namespace

TEST(MessageTable, DecidesOnlyWhenEveryRankSubmitted) {
  MessageTable table(3);
  CHECK(!table.Add(0, "g", 0, Allreduce()).has_value());
  CHECK(!table.Add(2, "g", 0, Allreduce()).has_value());
  const std::optional<Response> resp = table.Add(1, "g", 0, Allreduce());
  CHECK(resp.has_value());
  if (!resp) return;
  CHECK_EQ(resp->name, std::string("g"));
  CHECK_EQ(resp->seq, 0u);
  CHECK(resp->status.ok());
  CHECK(resp->sig == Allreduce());
  CHECK(resp->agreement == nullptr);  // only allgather and alltoall carry one
  // Decided entries are gone: the same key starts over.
  CHECK(!table.Add(0, "g", 0, Allreduce()).has_value());
}

TEST(MessageTable, SubmissionNumbersAreMatchedSeparately) {
  MessageTable table(2);
  CHECK(!table.Add(0, "g", 0, Allreduce()).has_value());
  CHECK(!table.Add(1, "g", 1, Allreduce()).has_value());  // rank 1 is a step ahead
  const auto second = table.Add(0, "g", 1, Allreduce());
  CHECK(second.has_value() && second->seq == 1);
  const auto first = table.Add(1, "g", 0, Allreduce());
  CHECK(first.has_value() && first->seq == 0);
}

TEST(MessageTable, RepeatedAddFromOneRankCountsOnce) {
  MessageTable table(2);
  CHECK(!table.Add(0, "g", 0, Allreduce({4})).has_value());
  CHECK(!table.Add(0, "g", 0, Allreduce({8})).has_value());
  const auto resp = table.Add(1, "g", 0, Allreduce({8}));
  CHECK(resp.has_value() && resp->status.ok());  // the later signature replaced the first
}

TEST(MessageTable, ClearDropsPendingSubmissions) {
  MessageTable table(2);
  table.Add(0, "g", 0, Allreduce());
  table.Clear();
  CHECK(!table.Add(1, "g", 0, Allreduce()).has_value());
}

TEST(MessageTable, DtypeMismatchNamesRanksAndValues) {
  const Response resp = DecideAll({Allreduce({4}, DType::kFloat32), Allreduce({4}, DType::kFloat64),
                                   Allreduce({4}, DType::kFloat64)});
  CHECK(resp.status.kind == ErrorKind::kMismatch);
  CHECK(Contains(resp.status.message, "mismatched collective 't' (allreduce)"));
  CHECK(Contains(resp.status.message, "dtype differs across ranks (rank 0: float32; ranks 1, 2: float64)"));
}

TEST(MessageTable, ShapeKindOpScaleAndRootMismatchesAreErrors) {
  CHECK(DecideAll({Allreduce({4}), Allreduce({5})}).status.kind == ErrorKind::kMismatch);
  CHECK(Contains(DecideAll({Allreduce({4}), Allreduce({5})}).status.message, "shape differs"));
  Signature bcast = Sig(Kind::kBroadcast, DType::kFloat32, {4});
  CHECK(Contains(DecideAll({Allreduce(), bcast}).status.message, "kind differs"));
  Signature maxed = Allreduce();
  maxed.op = ReduceOp::kMax;
  CHECK(Contains(DecideAll({Allreduce(), maxed}).status.message, "reduce op differs"));
  Signature scaled = Allreduce();
  scaled.prescale = 0.5;
  CHECK(Contains(DecideAll({Allreduce(), scaled}).status.message, "prescale differs"));
  Signature other_root = bcast;
  other_root.root = 1;
  CHECK(Contains(DecideAll({bcast, other_root}).status.message, "root differs"));
  Signature two = Allreduce();
  two.tensors.push_back({DType::kFloat32, {2}});
  CHECK(Contains(DecideAll({Allreduce(), two}).status.message, "number of tensors differs"));
}

TEST(MessageTable, ErrorResponseHasNoAgreement) {
  Signature a = Sig(Kind::kAllgather, DType::kFloat32, {2, 3});
  Signature b = Sig(Kind::kAllgather, DType::kInt32, {2, 3});
  const Response resp = DecideAll({a, b});
  CHECK(!resp.status.ok());
  CHECK(resp.agreement == nullptr);
}

TEST(MessageTable, BroadcastRootOutsideRanksIsInvalid) {
  Signature bcast = Sig(Kind::kBroadcast, DType::kFloat32, {4});
  bcast.root = 2;
  const Response resp = DecideAll({bcast, bcast});
  CHECK(resp.status.kind == ErrorKind::kInvalidArgument);
  CHECK(Contains(resp.status.message, "root 2 is outside [0, 2)"));
}

TEST(MessageTable, AllgatherAgreesOnEveryRanksRows) {
  // Rank r gathers r + 1 rows of (*, 3); the first dimension may differ eagerly.
  const Response resp = DecideAll({Sig(Kind::kAllgather, DType::kFloat32, {1, 3}),
                                   Sig(Kind::kAllgather, DType::kFloat32, {2, 3}),
                                   Sig(Kind::kAllgather, DType::kFloat32, {3, 3})});
  CHECK(resp.status.ok());
  CHECK(resp.agreement != nullptr);
  if (!resp.agreement) return;
  CHECK(resp.agreement->rows == (std::vector<int64_t>{1, 2, 3}));
  CHECK(!resp.agreement->static_shapes);
  // Trailing dimensions must still agree.
  const Response bad = DecideAll({Sig(Kind::kAllgather, DType::kFloat32, {1, 3}),
                                  Sig(Kind::kAllgather, DType::kFloat32, {1, 4})});
  CHECK(Contains(bad.status.message, "shape beyond the first dimension differs"));
}

TEST(MessageTable, StaticAllgatherNeedsEqualShapes) {
  Signature a = Sig(Kind::kAllgather, DType::kFloat32, {1, 3});
  Signature b = Sig(Kind::kAllgather, DType::kFloat32, {2, 3});
  a.static_shapes = true;  // one rank sized its output under jit
  const Response resp = DecideAll({a, b});
  CHECK(resp.status.kind == ErrorKind::kMismatch);
  CHECK(Contains(resp.status.message, "shape differs"));
}

TEST(MessageTable, AlltoallEqualBlocksAndSplits) {
  const Signature even = Sig(Kind::kAlltoall, DType::kFloat32, {4, 2});
  Response resp = DecideAll({even, even});
  CHECK(resp.status.ok());
  CHECK(resp.agreement && resp.agreement->rows == (std::vector<int64_t>{2, 2, 2, 2}));
  Signature split = Sig(Kind::kAlltoall, DType::kFloat32, {3, 2});
  split.splits = {1, 2};
  resp = DecideAll({split, even});  // rank 0 sends 1 to itself and 2 to rank 1
  CHECK(resp.status.ok());
  CHECK(resp.agreement && resp.agreement->rows == (std::vector<int64_t>{1, 2, 2, 2}));
}

TEST(MessageTable, AlltoallRejectsBadSplits) {
  const Signature odd = Sig(Kind::kAlltoall, DType::kFloat32, {3});
  CHECK(Contains(DecideAll({odd, odd}).status.message, "does not split into 2 equal blocks"));
  Signature wrong_sum = Sig(Kind::kAlltoall, DType::kFloat32, {3});
  wrong_sum.splits = {1, 1};
  CHECK(Contains(DecideAll({wrong_sum, wrong_sum}).status.message, "sum to 2 but its first dimension is 3"));
  Signature negative = Sig(Kind::kAlltoall, DType::kFloat32, {3});
  negative.splits = {4, -1};
  CHECK(Contains(DecideAll({negative, negative}).status.message, "negative count"));
  Signature three = Sig(Kind::kAlltoall, DType::kFloat32, {3});
  three.splits = {1, 1, 1};
  CHECK(DecideAll({three, three}).status.kind == ErrorKind::kMismatch);
  CHECK(Contains(DecideAll({Sig(Kind::kAlltoall, DType::kFloat32, {}), Sig(Kind::kAlltoall, DType::kFloat32, {})})
                     .status.message,
                 "is a scalar"));
}

// One tensor per device of a program over several devices of each process.
Signature OnDevices(Signature s, int devices) {
  const TensorSpec t = s.tensors.front();
  s.devices = devices;
  s.tensors.assign(devices, t);
  return s;
}

TEST(MessageTable, DeviceCountMismatchNamesRanksAndCounts) {
  const Response resp = DecideAll({OnDevices(Allreduce(), 4), OnDevices(Allreduce(), 2)});
  CHECK(resp.status.kind == ErrorKind::kMismatch);
  CHECK(Contains(resp.status.message, "devices per process"));
  CHECK(Contains(resp.status.message, "rank 0: 4; rank 1: 2"));
  CHECK(DecideAll({OnDevices(Allreduce(), 2), OnDevices(Allreduce(), 2)}).status.ok());
}

TEST(MessageTable, ReductionOverDevicesMustAgree) {
  Signature over = OnDevices(Allreduce(), 2);
  over.over_devices = true;
  const Response resp = DecideAll({over, OnDevices(Allreduce(), 2)});
  CHECK(resp.status.kind == ErrorKind::kMismatch);
  CHECK(Contains(resp.status.message, "reduction over the devices (axis_name)"));
  CHECK(Contains(resp.status.message, "rank 0: yes; rank 1: no"));
  CHECK(DecideAll({over, over}).status.ok());
}

TEST(MessageTable, AlltoallTakesOneTensorPerDevice) {
  const Signature two = OnDevices(Sig(Kind::kAlltoall, DType::kFloat32, {4, 2}), 2);
  Response resp = DecideAll({two, two});
  CHECK(resp.status.ok());
  CHECK(resp.agreement && resp.agreement->rows == (std::vector<int64_t>{2, 2, 2, 2}));
  Signature uneven = two;
  uneven.tensors[1].shape = {6, 2};
  CHECK(Contains(DecideAll({uneven, uneven}).status.message, "devices pass different shapes"));
  Signature split = two;
  split.splits = {1, 3};
  CHECK(Contains(DecideAll({split, split}).status.message, "splits are for one device per process"));
  Signature extra = two;
  extra.tensors.push_back(extra.tensors.front());  // two tensors on one of two devices
  CHECK(Contains(DecideAll({extra, extra}).status.message, "exactly one tensor"));
}

TEST(MessageTable, ReducescatterOfScalarIsInvalid) {
  const Signature scalar = Sig(Kind::kReducescatter, DType::kFloat32, {});
  const Response resp = DecideAll({scalar, scalar});
  CHECK(resp.status.kind == ErrorKind::kInvalidArgument);
  CHECK(DecideAll({Sig(Kind::kReducescatter, DType::kFloat32, {4}),
                   Sig(Kind::kReducescatter, DType::kFloat32, {4})}).status.ok());
}

TEST(MessageTable, JoinedRanksCompletePendingSubmissionsInKeyOrder) {
  MessageTable table(3);
  CHECK(!table.Add(0, "b", 0, Allreduce()).has_value());
  CHECK(!table.Add(1, "b", 0, Allreduce()).has_value());
  CHECK(!table.Add(0, "a", 1, Allreduce()).has_value());
  CHECK(!table.Add(1, "a", 1, Allreduce()).has_value());
  CHECK(!table.Add(0, "c", 0, Allreduce()).has_value());  // rank 1 has not submitted c
  const std::vector<Response> decided = table.SetJoined({false, false, true});
  CHECK_EQ(decided.size(), 2u);
  CHECK(decided.size() == 2 && decided[0].name == "a" && decided[1].name == "b");
  for (const Response& r : decided) CHECK(r.status.ok());
  // The same joined set again decides nothing new; c waits for rank 1 only.
  CHECK(table.SetJoined({false, false, true}).empty());
  CHECK(table.Add(1, "c", 0, Allreduce()).has_value());
}

TEST(MessageTable, AllgatherWithJoinedRankGetsNoRowsFromIt) {
  const Signature a = Sig(Kind::kAllgather, DType::kFloat32, {2});
  const Response resp = MessageTable::Decide("t", 0, {&a, nullptr, &a});
  CHECK(resp.status.ok());
  CHECK(resp.agreement && resp.agreement->rows == (std::vector<int64_t>{2, 0, 2}));
}
