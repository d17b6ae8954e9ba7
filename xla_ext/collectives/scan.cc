// scan: rank r gets the reduction of ranks 0..r's tensors (an inclusive
// prefix reduction, MPI_Scan; op, prescale, postscale).
#include <algorithm>

#include "collectives/collective.h"
#include "operations.h"
#include "reduce_ops.h"

namespace jaxcache {
namespace {

class Scan final : public Collective {
 public:
  Status Decide(const Checker& c, Agreement*) const override {
    JAXCACHE_RETURN_IF_ERROR(c.Reduction());
    if (c.first().op == ReduceOp::kAverage)
      return c.Error(ErrorKind::kInvalidArgument, "a scan has no average (the prefixes differ in length)");
    return c.Tensors();
  }
  std::size_t ResultBytes(const Signature&, const TensorSpec& spec, int, int) const override {
    return spec.NumBytes();
  }
  bool InPlace() const override { return true; }
  // A joined rank contributes the identity to the prefixes after it.
  std::string JoinConflict(const Signature&, const Agreement*, const std::vector<bool>&,
                           const std::string&) const override {
    return "";
  }
  void StandInTensor(const Signature& sig, const TensorSpec& t, int, int, StandInRequest& s) const override {
    StandInIdentity(sig, t, s);
  }
  const char* MpiPhase() const override { return "MPI_SCAN"; }

  // The operand is copied (prescaled) into the result, which is scanned in
  // place and postscaled, chunk by chunk.
  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const Signature& sig = r.sig;
    const TensorSpec& spec = sig.tensors[t];
    Comm& comm = ops.comm();
    const DType dtype = spec.dtype;
    const std::size_t esize = ElementSize(dtype);
    const int64_t count = spec.NumElements();
    if (count == 0) co_return;
    const char* in = static_cast<const char*>(r.inputs[t]);
    char* out = static_cast<char*>(r.outputs[t]);
    const int64_t step = comm.ChunkCount(esize);
    MPI_Datatype type = MpiDatatype(dtype);
    MPI_Op op = MpiOp(dtype, Reduction(sig.op));
    ops.stats().bytes_reduced += spec.NumBytes();
    ++ops.stats().mpi_calls;
    for (int64_t off = 0; off < count; off += step) {
      const int n = static_cast<int>(std::min(step, count - off));
      char* o = out + off * esize;
      CopyScaled(in + off * esize, o, n, dtype, sig.prescale);
      co_await comm.Run("MPI_Iscan", [&](MPI_Request* req) {
        return MPI_Iscan(MPI_IN_PLACE, o, n, type, op, comm.handle(), req);
      });
      if (sig.postscale != 1.0) Scale(o, o, n, dtype, sig.postscale);
    }
  }
};

}  // namespace

const Collective& ScanCollective() {
  static const Scan collective;
  return collective;
}

}  // namespace jaxcache
