// allreduce: every rank gets the reduction of every rank's tensors (op, with
// prescale and postscale; "average" divides by the ranks that contribute).
// Operations runs a cycle's allreduces together: small tensors fused, the
// others through Execute below, in place.
#include <algorithm>

#include "collectives/collective.h"
#include "operations.h"
#include "reduce_ops.h"

namespace jaxcache {
namespace {

class Allreduce final : public Collective {
 public:
  Status Decide(const Checker& c, Agreement*) const override {
    JAXCACHE_RETURN_IF_ERROR(c.Reduction());
    return c.Tensors();
  }
  std::size_t ResultBytes(const Signature&, const TensorSpec& spec, int, int) const override { return spec.NumBytes(); }
  bool InPlace() const override { return true; }
  // A joined rank contributes the identity.
  std::string JoinConflict(const Signature&, const Agreement*, const std::vector<bool>&,
                           const std::string&) const override {
    return "";
  }
  void StandInTensor(const Signature& sig, const TensorSpec& t, int, int, StandInRequest& s) const override {
    StandInIdentity(sig, t, s);
  }
  const char* MpiPhase() const override { return "MPI_ALLREDUCE"; }
  bool Fused() const override { return true; }

  // One tensor reduced in its result buffer. In-place MPI is markedly faster
  // than separate buffers (MPICH copies the send buffer itself), and the copy
  // into the output absorbs the prescale. Chunk by chunk: each is copied,
  // reduced and postscaled while in cache.
  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const Signature& sig = r.sig;
    const TensorSpec& spec = sig.tensors[t];
    const DType dtype = spec.dtype;
    const int64_t count = spec.NumElements();
    const void* in = r.inputs[t];
    void* out = r.outputs[t];
    if (in != out) AdviseHugePages(out, spec.NumBytes());
    const std::size_t esize = ElementSize(dtype);
    const int64_t step = ops.comm().ChunkCount(esize);
    const double prescale = ops.Prescale(r);
    ++ops.stats().mpi_calls;
    for (int64_t off = 0; off < count; off += step) {
      const int64_t n = std::min(step, count - off);
      char* o = static_cast<char*>(out) + off * esize;
      CopyScaled(static_cast<const char*>(in) + off * esize, o, n, dtype, prescale);
      co_await ops.comm().AllreduceData(o, o, n, dtype, sig.op);
      if (sig.postscale != 1.0) Scale(o, o, n, dtype, sig.postscale);
    }
  }
};

}  // namespace

const Collective& AllreduceCollective() {
  static const Allreduce collective;
  return collective;
}

}  // namespace jaxcache
