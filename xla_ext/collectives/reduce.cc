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

// Up to this many ranks, root receives every other rank's tensor itself and
// reduces locally (linear): its inbound traffic, (P - 1) tensors, is then at
// most the ~2 of MPI's reduce-scatter + gather, without MPI's temporary
// buffers and extra rounds. Pure MPI on one host, 16 KiB to 4 MiB, linear /
// MPI_Reduce: 0.40-0.93 at 2 ranks, 0.32-1.12 at 3 (median 0.75), 0.88-1.69
// at 4 (benchmarks/rooted_algorithms.py; benchmarks/README.md).
constexpr int kLinearMaxRanks = 3;
// Linear pieces: both sides cut a tensor alike; a piece is received and
// reduced while it is still in cache.
constexpr std::size_t kPieceBytes = std::size_t(1) << 20;

class Reduce final : public ElementwiseReduction {
 public:
  Reduce() : ElementwiseReduction({.checks_root = true, .mpi_phase = "MPI_REDUCE"}) {}
  std::string JoinConflict(const Signature& sig, const Agreement*, const std::vector<bool>& joined,
                           const std::string&) const override {
    return RootJoined(sig, joined, "would not receive the result");
  }

  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const TensorSpec& spec = r.sig.tensors[t];
    if (spec.NumElements() == 0) co_return;
    ops.stats().bytes_reduced += spec.NumBytes();
    if (ops.comm().size() <= kLinearMaxRanks) co_await Linear(ops, r, t);
    else co_await ByMpi(ops, r, t);
  }

 private:
  // Root: its operand (scaled) becomes the result, and every other rank's
  // piece is received and reduced into it in rank order. The others send
  // theirs piece by piece, copying each into their result meanwhile.
  static Task<> Linear(Operations& ops, Request& r, std::size_t t) {
    const TensorSpec& spec = r.sig.tensors[t];
    Comm& comm = ops.comm();
    const int root = r.sig.root;
    const DType dtype = spec.dtype;
    const ReduceOp op = Reduction(r.sig.op);
    const std::size_t esize = ElementSize(dtype);
    const int64_t count = spec.NumElements();
    const int64_t step = static_cast<int64_t>(std::max<std::size_t>(1, kPieceBytes / esize));
    const char* in = static_cast<const char*>(r.inputs[t]);
    char* out = static_cast<char*>(r.outputs[t]);
    const Scaling scaling = ops.ScalingFor(r, t);
    char* scratch = ops.Scratch(static_cast<std::size_t>(std::min(step, count)) * esize);
    if (in != out) AdviseHugePages(out, spec.NumBytes());
    ++ops.stats().mpi_calls;
    for (int64_t off = 0; off < count; off += step) {
      const int64_t n = std::min(step, count - off);
      const std::size_t bytes = static_cast<std::size_t>(n) * esize;
      const char* mine = in + off * esize;
      char* o = out + off * esize;
      if (comm.rank() != root) {
        const char* send = mine;
        if (scaling.pre != 1.0) {
          Scale(mine, scratch, n, dtype, scaling.pre);
          send = scratch;
        }
        co_await comm.Exchange(send, n, root, nullptr, 0, root, dtype, "a reduce", [&] {
          if (o != mine) std::memcpy(o, mine, bytes);
        });
        continue;
      }
      bool first = true;
      for (int q = 0; q < comm.size(); ++q) {
        if (q == root) continue;
        // The first piece received goes straight into the result when the
        // operand is elsewhere and unscaled: result = op(operand, piece).
        if (first && o != mine && scaling.pre == 1.0) {
          co_await comm.Exchange(nullptr, 0, q, o, n, q, dtype, "a reduce");
          ReduceLocal(dtype, op, mine, o, n);
        } else {
          if (first) CopyScaled(mine, o, n, dtype, scaling.pre);
          co_await comm.Exchange(nullptr, 0, q, scratch, n, q, dtype, "a reduce");
          ReduceLocal(dtype, op, scratch, o, n);
        }
        first = false;
      }
      if (first) CopyScaled(mine, o, n, dtype, scaling.pre);  // (a set of one rank)
      if (scaling.post != 1.0) Scale(o, o, n, dtype, scaling.post);
    }
  }

  // MPI's reduce: root reduces into its result in place (its operand copied
  // and prescaled there first); the others send their operand (prescaled into
  // scratch when asked) and keep it as their result. Chunked like an allreduce.
  static Task<> ByMpi(Operations& ops, Request& r, std::size_t t) {
    const Signature& sig = r.sig;
    const TensorSpec& spec = sig.tensors[t];
    Comm& comm = ops.comm();
    const int root = sig.root;
    const DType dtype = spec.dtype;
    const int64_t count = spec.NumElements();
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
