// scan: rank r gets the reduction of ranks 0..r's tensors (an inclusive
// prefix reduction, MPI_Scan; op, prescale, postscale).
#include "collectives/collective.h"
#include "operations.h"
#include "reduce_ops.h"

namespace jaxcache {
namespace {

class Scan final : public ElementwiseReduction {
 public:
  Status Decide(const Checker& c, Agreement*) const override {
    JAXCACHE_RETURN_IF_ERROR(c.Reduction());
    if (c.first().op == ReduceOp::kAverage)
      return c.Error(ErrorKind::kInvalidArgument, "a scan has no average (the prefixes differ in length)");
    return c.Tensors();
  }
  const char* MpiPhase() const override { return "MPI_SCAN"; }

  // The operand is copied (prescaled) into the result, which is scanned in
  // place and postscaled, chunk by chunk.
  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const TensorSpec& spec = r.sig.tensors[t];
    if (spec.NumElements() == 0) co_return;
    ops.stats().bytes_reduced += spec.NumBytes();
    Comm& comm = ops.comm();
    MPI_Datatype type = MpiDatatype(spec.dtype);
    MPI_Op op = MpiOp(spec.dtype, Reduction(r.sig.op));
    co_await ReduceByChunks(ops, r, t, r.sig.prescale, true, [&comm, type, op](char* chunk, int n) {
      return comm.Run("MPI_Iscan", [&comm, type, op, chunk, n](MPI_Request* req) {
        return MPI_Iscan(MPI_IN_PLACE, chunk, n, type, op, comm.handle(), req);
      });
    });
  }
};

}  // namespace

const Collective& ScanCollective() {
  static const Scan collective;
  return collective;
}

}  // namespace jaxcache
