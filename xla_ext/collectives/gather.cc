// gather: root gets every rank's tensor stacked along a new first dimension,
// in rank order; every other rank's result is its own operand, unchanged
// (mpi4jax's gather).
#include <algorithm>
#include <cstring>

#include "collectives/collective.h"
#include "operations.h"

namespace jaxcache {
namespace {

class Gather final : public RowMovement {
 public:
  Gather() : RowMovement({.checks_root = true, .mpi_phase = "MPI_GATHER"}) {}
  std::size_t ResultBytes(const Signature& sig, const TensorSpec& spec, int rank, int size) const override {
    return rank == sig.root ? spec.NumBytes() * size : spec.NumBytes();
  }
  std::string JoinConflict(const Signature&, const Agreement*, const std::vector<bool>&,
                           const std::string& who) const override {
    return "cannot run while " + who + " joined: root's result has a block for every rank";
  }

  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    Comm& comm = ops.comm();
    const int root = r.sig.root, me = comm.rank();
    const int64_t bytes = static_cast<int64_t>(r.sig.tensors[t].NumBytes());
    const char* in = static_cast<const char*>(r.inputs[t]);
    char* out = static_cast<char*>(r.outputs[t]);
    if (me != root && in != out) std::memcpy(out, in, bytes);
    if (bytes == 0) co_return;
    ++ops.stats().mpi_calls;
    if (bytes <= comm.max_count()) {
      const int n = static_cast<int>(bytes);
      co_await comm.Run("MPI_Igather", [&](MPI_Request* req) {
        return MPI_Igather(in, n, MPI_BYTE, me == root ? out : nullptr, n, MPI_BYTE, root, comm.handle(), req);
      });
      co_return;
    }
    // Blocks above the MPI count limit: root receives each rank's block piece by piece.
    const int64_t piece = comm.max_count();
    for (int q = 0; q < comm.size(); ++q) {
      if (me == root && q == root) std::memcpy(out + q * bytes, in, bytes);
      if (q == root || (me != root && me != q)) continue;
      for (int64_t off = 0; off < bytes; off += piece) {
        const int64_t n = std::min(piece, bytes - off);
        if (me == root) co_await comm.Exchange(nullptr, 0, q, out + q * bytes + off, n, q, DType::kUInt8, "a gather");
        else co_await comm.Exchange(in + off, n, root, nullptr, 0, root, DType::kUInt8, "a gather");
      }
    }
  }
};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Gather)

}  // namespace jaxcache
