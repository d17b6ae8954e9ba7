// JoinState: the joined-set mask, its bookkeeping across cycles, the result
// of join(), the collectives that cannot run without the joined ranks, and
// the stand-in requests a joined rank takes part with.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "join_state.h"

using namespace jaxcache;

namespace {

Signature Sig(Kind kind, DType dtype, std::vector<int64_t> shape, ReduceOp op = ReduceOp::kSum) {
  Signature s;
  s.kind = kind;
  s.op = op;
  s.tensors.push_back({dtype, std::move(shape)});
  return s;
}

// The agreed mask of `size` ranks with `joined` set (what the OR-allreduce yields).
std::vector<uint64_t> MaskOf(int size, const std::vector<int>& joined) {
  std::vector<uint64_t> mask((size + 63) / 64, 0);
  for (int r : joined) mask[r / 64] |= 1ull << (r % 64);
  return mask;
}

// A join() request whose output receives the last rank to join.
struct JoinRequest {
  int32_t result = -7;
  Request req;
  JoinRequest() { req.outputs.push_back(&result); }
};

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST(JoinState, MaskSetsOnlyThisRanksBitInTheRightWord) {
  JoinState state(70, 100);
  const std::vector<uint64_t> mask = state.Mask(true);
  CHECK_EQ(mask.size(), 2u);
  CHECK(mask.size() == 2 && mask[0] == 0 && mask[1] == (1ull << 6));
  for (uint64_t w : state.Mask(false)) CHECK_EQ(w, 0u);
}

TEST(JoinState, JoinedHereNeedsARequestAndNothingElsePending) {
  JoinState state(0, 2);
  CHECK(!state.requested());
  CHECK(!state.JoinedHere(false));
  JoinRequest join;
  state.Add(&join.req);
  CHECK(state.requested());
  CHECK(state.request() == &join.req);
  CHECK(state.JoinedHere(false));
  CHECK(!state.JoinedHere(true));
}

TEST(JoinState, UpdateCountsJoinedRanksAndWhetherTheSetGrew) {
  JoinState state(0, 3);
  state.Update(nullptr);  // the flag said nobody joined
  CHECK(!state.any() && !state.grew() && state.count() == 0);
  std::vector<uint64_t> mask = MaskOf(3, {1});
  state.Update(mask.data());
  CHECK(state.any() && !state.all() && state.grew());
  CHECK_EQ(state.count(), 1);
  CHECK(state.joined() == (std::vector<bool>{false, true, false}));
  state.Update(mask.data());  // the same set again: nothing new
  CHECK(!state.grew());
  mask = MaskOf(3, {0, 1, 2});
  state.Update(mask.data());
  CHECK(state.all() && state.grew());
  CHECK_EQ(state.count(), 3);
}

TEST(JoinState, FinishReportsTheLastRankToJoinAndForgets) {
  JoinState state(0, 4);
  JoinRequest join;
  state.Add(&join.req);
  std::vector<uint64_t> mask = MaskOf(4, {2});
  state.Update(mask.data());
  mask = MaskOf(4, {0, 1, 2, 3});  // 0, 1 and 3 in the same cycle: the highest counts
  state.Update(mask.data());
  CHECK(state.all());
  CHECK(state.Finish() == &join.req);
  CHECK_EQ(join.result, 3);
  CHECK(!state.requested() && !state.any() && state.count() == 0);
  CHECK(state.joined() == (std::vector<bool>(4, false)));
}

TEST(JoinState, LastJoinerIsKeptAcrossQuietCycles) {
  JoinState state(1, 3);
  JoinRequest join;
  state.Add(&join.req);
  std::vector<uint64_t> mask = MaskOf(3, {0, 2});
  state.Update(mask.data());
  state.Update(mask.data());
  mask = MaskOf(3, {0, 1, 2});
  state.Update(mask.data());  // rank 1 last, though 2 is higher
  state.Finish();
  CHECK_EQ(join.result, 1);
}

TEST(JoinState, ResetForgetsRequestAndJoinedSet) {
  JoinState state(0, 2);
  JoinRequest join;
  state.Add(&join.req);
  std::vector<uint64_t> mask = MaskOf(2, {1});
  state.Update(mask.data());
  state.Reset();
  CHECK(!state.requested() && !state.any());
  state.Update(mask.data());
  CHECK(state.grew());  // after a reset, the same set is news again
  CHECK_EQ(join.result, -7);  // a reset does not complete join()
}

TEST(JoinState, ConflictForCollectivesThatNeedTheJoinedRanks) {
  JoinState state(0, 3);
  std::vector<uint64_t> mask = MaskOf(3, {1});
  state.Update(mask.data());
  Signature bcast = Sig(Kind::kBroadcast, DType::kFloat32, {4});
  bcast.root = 1;
  Status st = state.Conflict("w", bcast, nullptr);
  CHECK(st.kind == ErrorKind::kInvalidArgument);
  CHECK(Contains(st.message, "broadcast 'w' cannot run: its root, rank 1, has joined"));
  bcast.root = 2;
  CHECK(state.Conflict("w", bcast, nullptr).ok());
  st = state.Conflict("x", Sig(Kind::kAlltoall, DType::kFloat32, {3}), nullptr);
  CHECK(Contains(st.message, "alltoall 'x' cannot run while rank 1 has joined"));
  Agreement jit_sized;
  jit_sized.static_shapes = true;
  const Signature gather = Sig(Kind::kAllgather, DType::kFloat32, {3});
  CHECK(!state.Conflict("g", gather, &jit_sized).ok());
  CHECK(state.Conflict("g", gather, nullptr).ok());
  CHECK(state.Conflict("r", Sig(Kind::kAllreduce, DType::kFloat32, {3}), nullptr).ok());
  CHECK(state.Conflict("s", Sig(Kind::kReducescatter, DType::kFloat32, {3}), nullptr).ok());
}

TEST(JoinState, ConflictMessageListsSeveralJoinedRanks) {
  JoinState state(0, 4);
  std::vector<uint64_t> mask = MaskOf(4, {1, 3});
  state.Update(mask.data());
  const Status st = state.Conflict("x", Sig(Kind::kAlltoall, DType::kFloat32, {4}), nullptr);
  CHECK(Contains(st.message, "while ranks 1, 3 have joined"));
}

TEST(JoinState, WithoutJoinedZeroesJoinedRanksRows) {
  JoinState state(0, 3);
  auto agreement = std::make_shared<Agreement>();
  agreement->rows = {1, 2, 3, 4, 5, 6};  // two tensors x three ranks
  CHECK(state.WithoutJoined(agreement) == agreement);  // nobody joined: unchanged, not copied
  CHECK(state.WithoutJoined(nullptr) == nullptr);
  std::vector<uint64_t> mask = MaskOf(3, {1});
  state.Update(mask.data());
  const auto without = state.WithoutJoined(agreement);
  CHECK(without && without->rows == (std::vector<int64_t>{1, 0, 3, 4, 0, 6}));
  CHECK(agreement->rows == (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));  // the cached one is untouched
}

TEST(JoinState, AllreduceStandInContributesTheIdentityInPlace) {
  JoinState state(0, 2);
  Request* sum = state.StandIn("s", Sig(Kind::kAllreduce, DType::kFloat32, {5}));
  CHECK_EQ(sum->name, std::string("s"));
  CHECK(sum->inputs.size() == 1 && sum->inputs[0] == sum->outputs[0]);
  const float* s = static_cast<const float*>(sum->inputs[0]);
  for (int i = 0; i < 5; ++i) CHECK_EQ(s[i], 0.0f);
  Request* prod = state.StandIn("p", Sig(Kind::kAllreduce, DType::kInt32, {3}, ReduceOp::kProd));
  const int32_t* p = static_cast<const int32_t*>(prod->inputs[0]);
  for (int i = 0; i < 3; ++i) CHECK_EQ(p[i], 1);
  Request* min = state.StandIn("m", Sig(Kind::kAllreduce, DType::kFloat64, {2}, ReduceOp::kMin));
  const double* m = static_cast<const double*>(min->inputs[0]);
  CHECK(std::isinf(m[0]) && m[0] > 0);
  Request* max = state.StandIn("x", Sig(Kind::kAllreduce, DType::kInt16, {2}, ReduceOp::kMax));
  CHECK_EQ(static_cast<const int16_t*>(max->inputs[0])[1], std::numeric_limits<int16_t>::lowest());
}

TEST(JoinState, ReducescatterStandInGetsItsShareOfRows) {
  JoinState state(1, 3);
  // 7 rows over 3 ranks: 3, 2, 2; rank 1 receives 2 rows of 4 floats.
  Request* req = state.StandIn("r", Sig(Kind::kReducescatter, DType::kFloat32, {7, 4}));
  CHECK(req->inputs.size() == 1 && req->outputs.size() == 1);
  CHECK(req->inputs[0] != req->outputs[0]);
  const float* in = static_cast<const float*>(req->inputs[0]);
  for (int i = 0; i < 28; ++i) CHECK_EQ(in[i], 0.0f);
}

TEST(JoinState, AllgatherStandInSendsNothingAndHasAStore) {
  JoinState state(0, 2);
  Request* req = state.StandIn("g", Sig(Kind::kAllgather, DType::kFloat32, {3}));
  CHECK(req->inputs.size() == 1 && req->inputs[0] == nullptr && req->outputs[0] == nullptr);
  CHECK(req->store != nullptr);
  Request* bcast = state.StandIn("b", Sig(Kind::kBroadcast, DType::kFloat32, {3}));
  CHECK(bcast->store == nullptr && bcast->outputs[0] != nullptr);
  state.ReleaseStandIns();  // the pointers above are dangling from here on
}
