// reduce: root gets the reduction of every rank's tensors (op, prescale,
// postscale; "average" divides by the ranks that contribute); every other
// rank's result is its own operand, unchanged (mpi4jax's reduce).
#include <algorithm>
#include <cstring>

#include "collectives/collective.h"
#include "operations.h"
#include "reduce_ops.h"

namespace jaxcache {
namespace {

class Reduce final : public ElementwiseReduction {
 public:
  Reduce() : ElementwiseReduction({.checks_root = true, .mpi_phase = "MPI_REDUCE"}) {}
  std::string JoinConflict(const Signature& sig, const Agreement*, const std::vector<bool>& joined,
                           const std::string&) const override {
    return RootJoined(sig, joined, "would not receive the result");
  }

  // Root reduces into its result in place (its operand copied and prescaled
  // there first); the others send their operand (prescaled into scratch when
  // asked) and keep it as their result. Chunked like an allreduce.
  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const Signature& sig = r.sig;
    const TensorSpec& spec = sig.tensors[t];
    Comm& comm = ops.comm();
    const int root = sig.root;
    const DType dtype = spec.dtype;
    const int64_t count = spec.NumElements();
    if (count == 0) co_return;
    ops.stats().bytes_reduced += spec.NumBytes();
    MPI_Datatype type = MpiDatatype(dtype);
    MPI_Op op = MpiOp(dtype, Reduction(sig.op));
    const Scaling scaling = ops.ScalingFor(r, t);
    if (comm.rank() == root) {
      co_await ReduceByChunks(ops, r, t, scaling, [&comm, type, op, root](char* chunk, int n) {
        return comm.Run("MPI_Ireduce", [&comm, type, op, root, chunk, n](MPI_Request* req) {
          return MPI_Ireduce(MPI_IN_PLACE, chunk, n, type, op, root, comm.handle(), req);
        });
      });
      co_return;
    }
    // The result is the operand. Unscaled chunks go out straight from the
    // operand while this thread copies them into the result (the copy is off
    // the critical path); prescaled ones go out of scratch.
    const std::size_t esize = ElementSize(dtype);
    const char* in = static_cast<const char*>(r.inputs[t]);
    char* out = static_cast<char*>(r.outputs[t]);
    const int64_t step = comm.ChunkCount(esize);
    char* scaled = scaling.pre == 1.0 ? nullptr : ops.Scratch(std::min(step, count) * esize);
    ++ops.stats().mpi_calls;
    for (int64_t off = 0; off < count; off += step) {
      const int n = static_cast<int>(std::min(step, count - off));
      const char* chunk = in + off * esize;
      const char* send = chunk;
      if (scaled) {
        Scale(chunk, scaled, n, dtype, scaling.pre);
        send = scaled;
      }
      co_await comm.Run(
          "MPI_Ireduce",
          [&](MPI_Request* req) { return MPI_Ireduce(send, nullptr, n, type, op, root, comm.handle(), req); },
          [&] {
            if (in != out) std::memcpy(out + off * esize, chunk, static_cast<std::size_t>(n) * esize);
          });
    }
  }
};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Reduce)

}  // namespace jaxcache
