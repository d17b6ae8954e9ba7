// The per-kind definitions (collectives/): what rank 0 decides for the rooted
// kinds and the scan, and the result sizes a submitter must provide.
#include <string>
#include <vector>

#include "check.h"
#include "collectives/collective.h"
#include "message_table.h"

using namespace jaxcache;

namespace {

Signature Sig(Kind kind, std::vector<int64_t> shape, int32_t root = 0, ReduceOp op = ReduceOp::kSum) {
  Signature s;
  s.kind = kind;
  s.root = root;
  s.op = op;
  s.tensors.push_back({DType::kFloat32, std::move(shape)});
  return s;
}

Response DecideAll(const std::vector<Signature>& sigs) {
  std::vector<const Signature*> by_rank;
  for (const Signature& s : sigs) by_rank.push_back(&s);
  return MessageTable::Decide("t", 0, by_rank);
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST(Collectives, EveryKindHasADefinitionNamedLikeItsKind) {
  for (int k = 0; k < kNumKinds; ++k) {
    const Collective& c = CollectiveOf(static_cast<Kind>(k));
    // Distinct objects: no kind falls back on another's definition.
    for (int j = 0; j < k; ++j) CHECK(&CollectiveOf(static_cast<Kind>(j)) != &c);
    CHECK(std::string(KindName(static_cast<Kind>(k))) != "unknown");
  }
}

TEST(Collectives, ReduceChecksRootOpAndShape) {
  CHECK(DecideAll({Sig(Kind::kReduce, {3}, 1), Sig(Kind::kReduce, {3}, 1)}).status.ok());
  CHECK(Contains(DecideAll({Sig(Kind::kReduce, {3}, 0), Sig(Kind::kReduce, {3}, 1)}).status.message,
                 "root differs"));
  CHECK(Contains(DecideAll({Sig(Kind::kReduce, {3}, 2), Sig(Kind::kReduce, {3}, 2)}).status.message,
                 "root 2 is outside [0, 2)"));
  CHECK(Contains(DecideAll({Sig(Kind::kReduce, {3}), Sig(Kind::kReduce, {3}, 0, ReduceOp::kMax)}).status.message,
                 "reduce op differs"));
  CHECK(Contains(DecideAll({Sig(Kind::kReduce, {3}), Sig(Kind::kReduce, {4})}).status.message, "shape differs"));
}

TEST(Collectives, ScanHasNoAverage) {
  const Response resp = DecideAll({Sig(Kind::kScan, {3}, 0, ReduceOp::kAverage),
                                   Sig(Kind::kScan, {3}, 0, ReduceOp::kAverage)});
  CHECK(resp.status.kind == ErrorKind::kInvalidArgument);
  CHECK(Contains(resp.status.message, "no average"));
  CHECK(DecideAll({Sig(Kind::kScan, {3}, 0, ReduceOp::kProd), Sig(Kind::kScan, {3}, 0, ReduceOp::kProd)}).status.ok());
}

TEST(Collectives, ScatterNeedsABlockPerRankAtRoot) {
  // Root 1 of 3 ranks holds (3, 2): one (2,) block per rank.
  CHECK(DecideAll({Sig(Kind::kScatter, {2}, 1), Sig(Kind::kScatter, {3, 2}, 1), Sig(Kind::kScatter, {2}, 1)})
            .status.ok());
  const Response wrong_rows =
      DecideAll({Sig(Kind::kScatter, {2}, 1), Sig(Kind::kScatter, {4, 2}, 1), Sig(Kind::kScatter, {2}, 1)});
  CHECK(wrong_rows.status.kind == ErrorKind::kInvalidArgument);
  CHECK(Contains(wrong_rows.status.message, "first dimension must be the number of ranks, 3"));
  const Response wrong_block =
      DecideAll({Sig(Kind::kScatter, {2}, 1), Sig(Kind::kScatter, {3, 2}, 1), Sig(Kind::kScatter, {5}, 1)});
  CHECK(wrong_block.status.kind == ErrorKind::kMismatch);
  CHECK(Contains(wrong_block.status.message, "ranks 0, 1: (2,); rank 2: (5,)"));
}

TEST(Collectives, RootedResultSizesDependOnTheRank) {
  const Signature gather = Sig(Kind::kGather, {2, 3}, 1);
  const TensorSpec& g = gather.tensors[0];
  CHECK_EQ(CollectiveOf(Kind::kGather).ResultBytes(gather, g, 1, 4), std::size_t(4 * 24));
  CHECK_EQ(CollectiveOf(Kind::kGather).ResultBytes(gather, g, 0, 4), std::size_t(24));
  const Signature scatter = Sig(Kind::kScatter, {4, 3}, 1);
  CHECK_EQ(CollectiveOf(Kind::kScatter).ResultBytes(scatter, scatter.tensors[0], 1, 4), std::size_t(12));
  const Signature block = Sig(Kind::kScatter, {3}, 1);
  CHECK_EQ(CollectiveOf(Kind::kScatter).ResultBytes(block, block.tensors[0], 2, 4), std::size_t(12));
  const Signature reduce = Sig(Kind::kReduce, {5}, 0);
  CHECK_EQ(CollectiveOf(Kind::kReduce).ResultBytes(reduce, reduce.tensors[0], 1, 4), std::size_t(20));
}

TEST(Collectives, JoinedRootRefusesRootedKinds) {
  const std::vector<bool> joined{false, true};
  for (Kind kind : {Kind::kBroadcast, Kind::kReduce}) {
    CHECK(!CollectiveOf(kind).JoinConflict(Sig(kind, {2}, 1), nullptr, joined, "rank 1 has").empty());
    CHECK(CollectiveOf(kind).JoinConflict(Sig(kind, {2}, 0), nullptr, joined, "rank 1 has").empty());
  }
  for (Kind kind : {Kind::kGather, Kind::kScatter, Kind::kAlltoall})
    CHECK(!CollectiveOf(kind).JoinConflict(Sig(kind, {2}, 0), nullptr, joined, "rank 1 has").empty());
  for (Kind kind : {Kind::kAllreduce, Kind::kScan, Kind::kReducescatter, Kind::kBarrier})
    CHECK(CollectiveOf(kind).JoinConflict(Sig(kind, {2}, 0), nullptr, joined, "rank 1 has").empty());
}
