// allreduce: every rank gets the reduction of every rank's tensors (op, with
// prescale and postscale; "average" divides by the ranks that contribute).
// Operations runs a cycle's allreduces together: small tensors fused, the
// others through Execute below, in place.
#include "collectives/collective.h"
#include "operations.h"
#include "reduce_ops.h"

namespace jaxcache {
namespace {

class Allreduce final : public ElementwiseReduction {
 public:
  Allreduce() : ElementwiseReduction({.fused = true, .mpi_phase = "MPI_ALLREDUCE"}) {}

  // One tensor reduced in its result buffer. In-place MPI is markedly faster
  // than separate buffers (MPICH copies the send buffer itself), and the copy
  // into the output absorbs the prescale.
  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const DType dtype = r.sig.tensors[t].dtype;
    const ReduceOp op = r.sig.op;
    co_await ReduceByChunks(ops, r, t, ops.ScalingFor(r, t), [&ops, dtype, op](char* chunk, int n) {
      return ops.comm().AllreduceData(chunk, chunk, n, dtype, op);
    });
  }
};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Allreduce)

}  // namespace jaxcache
