// What one kind of collective does, in one place: what the ranks must agree
// on, the size of its results, how a rank that has joined takes part, and how
// it moves data. Each kind's Collective lives in collectives/<name>.cc; the
// runtime's generic parts (message table, join state, executor, submission,
// XLA handlers) ask CollectiveOf(kind). docs/design.md, "Adding a collective".
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "common.h"
#include "request.h"
#include "task.h"

namespace jaxcache {

class Operations;

// Rank 0's checks of one decision, over the ranks that submitted (by_rank[r]
// is null for a rank that has joined; at least one is not null).
class Checker {
 public:
  Checker(const std::string& name, const std::vector<const Signature*>& by_rank);
  const Signature& first() const { return *first_; }
  int size() const { return static_cast<int>(by_rank_.size()); }

  using Field = std::function<std::string(const Signature&)>;
  // A MismatchError when `key` differs between the submitting ranks (only
  // those for which `among` holds, default all); the message shows `shown`
  // (default: the key) of every rank.
  Status Same(const std::string& field, const Field& key, const Field& shown = nullptr,
              const std::function<bool(const Signature&)>& among = nullptr) const;
  // As Same, with a key that may depend on the rank.
  Status SameByRank(const std::string& field, const std::function<std::string(int, const Signature&)>& key) const;
  // An error about this collective: "mismatched collective 'x' (kind): what".
  Status Error(ErrorKind kind, const std::string& what) const;
  template <typename Fn>
  void ForEachRank(Fn&& fn) const {
    for (int r = 0; r < size(); ++r)
      if (by_rank_[r]) fn(r, *by_rank_[r]);
  }

  // The checks several kinds share.
  // Every tensor's dtype and shape agree (only beyond the first dimension
  // when `first_dim_may_differ`).
  Status Tensors(bool first_dim_may_differ = false) const;
  // Every tensor has a first dimension to split.
  Status NotScalars() const;
  // The reduce op, prescale and postscale agree.
  Status Reduction() const;
  // The root agrees and is a rank of the set.
  Status Root() const;

 private:
  const std::string& name_;
  const std::vector<const Signature*>& by_rank_;
  const Signature* first_ = nullptr;
};

#define JAXCACHE_RETURN_IF_ERROR(expr) \
  do {                                 \
    Status st_ = (expr);               \
    if (!st_.ok()) return st_;         \
  } while (0)

// A request standing in for a joined rank in a collective it did not submit,
// with the buffers it owns.
struct StandInRequest {
  RequestPtr request;
  std::vector<OutputStore::Buffer> buffers;
};

// What a kind is, as opposed to what it does: read by the generic parts.
struct Traits {
  // The checks the default Decide makes, in this order, before the tensors'
  // dtypes and shapes (Checker::Tensors).
  bool checks_root = false;       // Checker::Root
  bool checks_reduction = false;  // Checker::Reduction
  bool splits_rows = false;       // Checker::NotScalars
  // The result overwrites the operand (a CUDA handler stages both in one region).
  bool in_place = false;
  // Result sizes follow from every rank's rows (allgather, alltoall): a
  // submitter that sized them (XLA, eager outputs) needs equal shapes on every
  // rank (Signature::static_shapes); otherwise the executor allocates them.
  bool agreed_sizes = false;
  // Executed together with every other such request of the cycle, small
  // tensors fused (allreduce); otherwise request by request, tensor by tensor.
  bool fused = false;
  // The timeline phase of its MPI work; null when the negotiation was all of
  // it (barrier, join): Execute is then never called.
  const char* mpi_phase = nullptr;
};

class Collective {
 public:
  explicit Collective(const Traits& traits) : traits_(traits) {}
  virtual ~Collective() = default;

  bool InPlace() const { return traits_.in_place; }
  bool AgreedSizes() const { return traits_.agreed_sizes; }
  bool Fused() const { return traits_.fused; }
  const char* MpiPhase() const { return traits_.mpi_phase; }

  // --- negotiation (rank 0) ---
  // Checks what the ranks must agree on beyond the kind, the device and the
  // number of tensors (checked for every kind): by default the traits' checks,
  // then the tensors. A kind with agreed sizes fills `agreement` with every
  // rank's rows.
  virtual Status Decide(const Checker& c, Agreement* agreement) const;

  // --- results ---
  // Bytes of the result of tensor `spec` of `sig` on `rank` of `size` when every rank
  // has the same shapes (what a result sized by the submitter must hold).
  virtual std::size_t ResultBytes(const Signature& sig, const TensorSpec& spec, int rank, int size) const = 0;

  // --- join (join_state.h) ---
  // Why the collective cannot run while the ranks marked in `joined` have
  // joined (`who`: "rank 1 has" / "ranks 1, 2 have"); "" when it can.
  virtual std::string JoinConflict(const Signature& sig, const Agreement* agreement,
                                   const std::vector<bool>& joined, const std::string& who) const = 0;
  // A joined rank's part in tensor `t`: appends its operand and result
  // (buffers it allocates into `s`) to s.request.
  virtual void StandInTensor(const Signature& sig, const TensorSpec& t, int rank, int size,
                             StandInRequest& s) const = 0;

  // --- execution (operations.h) ---
  // Moves tensor `t` of `r`. Every rank makes the same MPI calls in the same order.
  virtual Task<> Execute(Operations& ops, Request& r, std::size_t t) const = 0;

 private:
  Traits traits_;
};

// Pieces several kinds share.
// A joined rank's part in a reduction: the identity of sig.op in, in place.
void StandInIdentity(const Signature& sig, const TensorSpec& t, StandInRequest& s);
// A joined rank's part when it takes none (the kind refuses to run while one has joined).
void StandInNothing(StandInRequest& s);
// "" unless sig.root has joined: then why the collective cannot run (`lost`: what of the
// root's would be lost, e.g. "has no data to send").
std::string RootJoined(const Signature& sig, const std::vector<bool>& joined, const char* lost);

// The reductions' in-place pattern, chunk by chunk (at most JAXCACHE_CHUNK_BYTES): tensor
// t's operand is copied into its result multiplied by scaling.pre, `reduce(chunk, n)` reduces
// that chunk in place, and it is multiplied by scaling.post -- each step while the chunk is
// in cache.
using ChunkReduction = std::function<Task<>(char* chunk, int n)>;
Task<> ReduceByChunks(Operations& ops, Request& r, std::size_t t, Scaling scaling, ChunkReduction reduce);

// Sets of up to this many ranks reduce by pairwise exchanges at every size
// (allreduce's large tensors, reducescatter; benchmarks/README.md, "The runtime's
// constants").
constexpr int kPairwiseRanks = 4;
// A reducescatter as size - 1 pairwise exchanges, piece by piece (JAXCACHE_CHUNK_BYTES):
// rank r's block (counts[r] elements, the blocks consecutive in `in`) of the reduction,
// each element multiplied by `prescale` first and by `postscale` after, lands in `out`.
// What arrives is received into `out` and reduced there while it is in cache: no packing
// copy, no MPI temporary, no extra pass. `out` may be this rank's own block of `in` (an
// allreduce in place). `what` names the collective in errors.
Task<> PairwiseReducescatter(Operations& ops, const void* in, void* out, const std::vector<int64_t>& counts,
                             DType dtype, ReduceOp op, double prescale, double postscale, const char* what);
// Then an allgather in place: rank r's block of `buf` (counts[r] elements, consecutive)
// goes to every rank, by the same pairwise steps.
Task<> PairwiseAllgather(Operations& ops, void* buf, const std::vector<int64_t>& counts, DType dtype,
                         const char* what);

// An allreduce of `count` elements from `in` into `out` (which may be `in`) as the two
// pairwise steps above: the operand is read where it is, never copied, and each element
// is reduced on one rank only (identical results everywhere).
Task<> PairwiseAllreduce(Operations& ops, const void* in, void* out, int64_t count, DType dtype, ReduceOp op,
                         Scaling scaling);

// A reduction whose result has its operand's shape (allreduce, reduce, scan): a rank that
// has joined contributes the identity.
class ElementwiseReduction : public Collective {
 public:
  explicit ElementwiseReduction(Traits traits) : Collective(WithReduction(traits)) {}
  std::size_t ResultBytes(const Signature&, const TensorSpec& spec, int, int) const override {
    return spec.NumBytes();
  }
  std::string JoinConflict(const Signature&, const Agreement*, const std::vector<bool>&,
                           const std::string&) const override {
    return "";
  }
  void StandInTensor(const Signature& sig, const TensorSpec& t, int, int, StandInRequest& s) const override {
    StandInIdentity(sig, t, s);
  }

 private:
  static Traits WithReduction(Traits t) {
    t.checks_reduction = t.in_place = true;
    return t;
  }
};

// A collective that moves rows between ranks and cannot run while one has joined
// (alltoall, gather, scatter): its result is separate from its operand.
class RowMovement : public Collective {
 public:
  using Collective::Collective;
  void StandInTensor(const Signature&, const TensorSpec&, int, int, StandInRequest& s) const override {
    StandInNothing(s);
  }
};

// A collective without tensors whose negotiation is all of it (barrier, join).
class Tensorless : public Collective {
 public:
  Tensorless() : Collective({.in_place = true}) {}
  std::size_t ResultBytes(const Signature&, const TensorSpec&, int, int) const override { return 0; }
  std::string JoinConflict(const Signature&, const Agreement*, const std::vector<bool>&,
                           const std::string&) const override {
    return "";
  }
  void StandInTensor(const Signature&, const TensorSpec&, int, int, StandInRequest&) const override {}
  Task<> Execute(Operations&, Request&, std::size_t) const override { co_return; }
};

// The definition of `kind` (collectives/<name>.cc).
const Collective& CollectiveOf(Kind kind);

// Defines <Class>Collective(), the accessor kinds.h names for Class (in
// namespace jaxcache, outside the file's anonymous namespace).
#define JAXCACHE_DEFINE_COLLECTIVE(Class) \
  const Collective& Class##Collective() { \
    static const Class collective;        \
    return collective;                    \
  }

}  // namespace jaxcache
