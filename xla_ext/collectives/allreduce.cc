// allreduce: every rank gets the reduction of every rank's tensors (op, with
// prescale and postscale; "average" divides by the ranks that contribute).
// Operations runs a cycle's allreduces together: small tensors fused, the
// others through Execute below, in place.
#include <vector>

#include "collectives/collective.h"
#include "operations.h"
#include "reduce_ops.h"

namespace jaxcache {
namespace {

class Allreduce final : public ElementwiseReduction {
 public:
  Allreduce() : ElementwiseReduction({.fused = true, .mpi_phase = "MPI_ALLREDUCE"}) {}

  // One tensor reduced into its result buffer. Up to kPairwiseRanks ranks: a
  // pairwise reducescatter from the operand into this rank's block of the
  // result, then a pairwise allgather of the blocks -- the operand is read
  // once and never copied (MPICH's allreduce copies it into the result first,
  // a large part of a ResNet-50 set's time) (benchmarks/README.md, "Figures behind the runtime's comments"). More ranks: MPI's allreduce in
  // place, chunk by chunk (in-place MPI is markedly faster than separate
  // buffers, MPICH copying the send buffer itself), the copy into the result
  // absorbing the prescale.
  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const DType dtype = r.sig.tensors[t].dtype;
    const ReduceOp op = r.sig.op;
    const Scaling scaling = ops.ScalingFor(r, t);
    const int size = ops.comm().size();
    if (size > 1 && size <= kPairwiseRanks) {
      if (r.inputs[t] != r.outputs[t]) AdviseHugePages(r.outputs[t], r.sig.tensors[t].NumBytes());
      co_await PairwiseAllreduce(ops, r.inputs[t], r.outputs[t], r.sig.tensors[t].NumElements(), dtype, op,
                                 scaling);
      co_return;
    }
    co_await ReduceByChunks(ops, r, t, scaling, [&ops, dtype, op](char* chunk, int n) {
      return ops.comm().AllreduceData(chunk, chunk, n, dtype, op);
    });
  }
};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Allreduce)

}  // namespace jaxcache
