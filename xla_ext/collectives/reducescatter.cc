// reducescatter: the reduction of every rank's tensor, split along the first
// dimension; rank r gets block r (the first rows % size ranks one row more).
#include <algorithm>

#include "collectives/collective.h"
#include "operations.h"
#include "reduce_ops.h"

namespace jaxcache {
namespace {

// Pairwise exchanges (PairwiseReducescatter, collective.h) run on up to
// kPairwiseRanks ranks at any size, and on more from this many bytes (MPICH's
// own crossover to pairwise exchange); faster than MPI_Ireduce_scatter_block
// at every size measured (benchmarks/README.md, "The runtime's constants").
constexpr int64_t kPairwiseBytes = 512 << 10;

class Reducescatter final : public Collective {
 public:
  Reducescatter()
      : Collective({.checks_reduction = true, .splits_rows = true, .mpi_phase = "MPI_REDUCESCATTER"}) {}
  std::size_t ResultBytes(const Signature&, const TensorSpec& spec, int rank, int size) const override {
    return ScatterRows(spec.Rows(), size, rank) * spec.RowBytes();
  }
  // A joined rank contributes the identity.
  std::string JoinConflict(const Signature&, const Agreement*, const std::vector<bool>&,
                           const std::string&) const override {
    return "";
  }
  void StandInTensor(const Signature& sig, const TensorSpec& t, int rank, int size,
                     StandInRequest& s) const override {
    s.buffers.push_back(OutputStore::Allocate(t.NumBytes(), t.shape));
    char* in = s.buffers.back().data.get();
    FillIdentity(in, t.NumElements(), t.dtype, sig.op);
    s.buffers.push_back(OutputStore::Allocate(ScatterRows(t.Rows(), size, rank) * t.RowBytes(), {}));
    s.request->inputs.push_back(in);
    s.request->outputs.push_back(s.buffers.back().data.get());
  }

  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const Signature& sig = r.sig;
    const TensorSpec& spec = sig.tensors[t];
    const int size = ops.comm().size();
    const int64_t row = static_cast<int64_t>(spec.RowBytes() / ElementSize(spec.dtype));
    std::vector<int64_t> counts(size);
    for (int q = 0; q < size; ++q) counts[q] = ScatterRows(spec.Rows(), size, q) * row;
    const int64_t count = spec.NumElements();
    if (count == 0) co_return;
    ops.stats().bytes_reduced += spec.NumBytes();
    void* out = r.outputs[t];
    AdviseHugePages(out, counts[ops.comm().rank()] * ElementSize(spec.dtype));
    const double post = sig.op == ReduceOp::kAverage ? sig.postscale / ops.AverageDivisor(r) : sig.postscale;
    if (size > 1 && (size <= kPairwiseRanks || static_cast<int64_t>(spec.NumBytes()) >= kPairwiseBytes)) {
      co_await PairwiseReducescatter(ops, r.inputs[t], out, counts, spec.dtype, sig.op, sig.prescale, post,
                                     "a reducescatter");
      co_return;
    }
    // The input is not copied unless a prescale asks for it; an average's
    // division is applied to the (smaller) result instead.
    const void* in = r.inputs[t];
    if (sig.prescale != 1.0) {
      char* scaled = ops.Scratch(spec.NumBytes());
      Scale(in, scaled, count, spec.dtype, sig.prescale);
      in = scaled;
    }
    ++ops.stats().mpi_calls;
    co_await ops.comm().ReducescatterData(in, out, counts, spec.dtype, sig.op);
    if (post != 1.0) Scale(out, out, counts[ops.comm().rank()], spec.dtype, post);
  }
};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Reducescatter)

}  // namespace jaxcache
