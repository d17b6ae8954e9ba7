// scan: rank r gets the reduction of ranks 0..r's tensors (an inclusive
// prefix reduction, MPI_Scan; op, prescale, postscale).
#include "collectives/collective.h"
#include "operations.h"
#include "reduce_ops.h"

namespace jaxcache {
namespace {

class Scan final : public ElementwiseReduction {
 public:
  Scan() : ElementwiseReduction({.mpi_phase = "MPI_SCAN"}) {}
  Status Decide(const Checker& c, Agreement*) const override {
    JAXCACHE_RETURN_IF_ERROR(c.Reduction());
    if (c.first().op == ReduceOp::kAverage)
      return c.Error(ErrorKind::kInvalidArgument, "a scan has no average (the prefixes differ in length)");
    return c.Tensors();
  }

  // The operand is copied (prescaled) into the result, which is scanned in
  // place and postscaled, chunk by chunk.
  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const TensorSpec& spec = r.sig.tensors[t];
    if (spec.NumElements() == 0) co_return;
    ops.stats().bytes_reduced += spec.NumBytes();
    Comm& comm = ops.comm();
    MPI_Datatype type = MpiDatatype(spec.dtype);
    MPI_Op op = MpiOp(spec.dtype, Reduction(r.sig.op));
    co_await ReduceByChunks(ops, r, t, {r.sig.prescale, r.sig.postscale}, [&comm, type, op](char* chunk, int n) {
      return comm.Run("MPI_Iscan", [&comm, type, op, chunk, n](MPI_Request* req) {
        return MPI_Iscan(MPI_IN_PLACE, chunk, n, type, op, comm.handle(), req);
      });
    });
  }
};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Scan)

}  // namespace jaxcache
