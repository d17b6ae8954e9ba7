// scatter: root's tensor has one block per rank along its first dimension;
// rank r gets block r. The other ranks' operands have a block's shape (their
// values are not read), so every rank's result has that shape (mpi4jax's scatter).
#include <algorithm>
#include <cstring>

#include "collectives/collective.h"
#include "operations.h"

namespace jaxcache {
namespace {

// From this block size on, root sends each rank its block itself (linear)
// instead of MPI's binomial scatter, which forwards blocks through other
// ranks. Pure MPI on one host, linear / MPI_Scatter: 0.50-0.73 from 256 KiB
// at 2-4 ranks, 0.70-1.21 below (benchmarks/rooted_algorithms.py;
// benchmarks/README.md).
constexpr int64_t kLinearBlockBytes = int64_t(256) << 10;

// "(3, 4)" for a (P, 3, 4) tensor: one block.
std::string BlockShape(const TensorSpec& t) {
  TensorSpec block = t;
  if (!block.shape.empty()) block.shape.erase(block.shape.begin());
  return block.ShapeString();
}

class Scatter final : public RowMovement {
 public:
  Scatter() : RowMovement({.mpi_phase = "MPI_SCATTER"}) {}
  Status Decide(const Checker& c, Agreement*) const override {
    JAXCACHE_RETURN_IF_ERROR(c.Root());
    const int root = c.first().root;
    Status bad;
    c.ForEachRank([&](int r, const Signature& s) {
      if (r != root || !bad.ok()) return;
      for (std::size_t t = 0; t < s.tensors.size(); ++t) {
        const TensorSpec& spec = s.tensors[t];
        if (spec.shape.empty() || spec.shape[0] != c.size())
          bad = c.Error(ErrorKind::kInvalidArgument,
                        "root (rank " + std::to_string(root) + ")'s tensor " + std::to_string(t) + " has shape " +
                            spec.ShapeString() + "; its first dimension must be the number of ranks, " +
                            std::to_string(c.size()));
      }
    });
    JAXCACHE_RETURN_IF_ERROR(bad);
    for (std::size_t t = 0; t < c.first().tensors.size(); ++t) {
      JAXCACHE_RETURN_IF_ERROR(c.Same("dtype of tensor " + std::to_string(t), [t](const Signature& s) {
        return std::string(DTypeName(s.tensors[t].dtype));
      }));
      JAXCACHE_RETURN_IF_ERROR(c.SameByRank(
          "block shape of tensor " + std::to_string(t) + " (root's shape without its first dimension)",
          [&](int r, const Signature& s) {
            return r == root ? BlockShape(s.tensors[t]) : s.tensors[t].ShapeString();
          }));
    }
    return Status::Ok();
  }
  std::size_t ResultBytes(const Signature& sig, const TensorSpec& spec, int rank, int) const override {
    return rank == sig.root ? spec.RowBytes() : spec.NumBytes();
  }
  std::string JoinConflict(const Signature&, const Agreement*, const std::vector<bool>&,
                           const std::string& who) const override {
    return "cannot run while " + who + " joined: root's tensor has a block for every rank";
  }

  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    Comm& comm = ops.comm();
    const int root = r.sig.root, me = comm.rank();
    const TensorSpec& spec = r.sig.tensors[t];
    const int64_t bytes = static_cast<int64_t>(me == root ? spec.RowBytes() : spec.NumBytes());
    const char* in = static_cast<const char*>(r.inputs[t]);
    char* out = static_cast<char*>(r.outputs[t]);
    if (bytes == 0) co_return;
    ++ops.stats().mpi_calls;
    if (bytes < kLinearBlockBytes && bytes <= comm.max_count()) {
      const int n = static_cast<int>(bytes);
      co_await comm.Run("MPI_Iscatter", [&](MPI_Request* req) {
        return MPI_Iscatter(me == root ? in : nullptr, n, MPI_BYTE, out, n, MPI_BYTE, root, comm.handle(), req);
      });
      co_return;
    }
    // Large blocks (and blocks above the MPI count limit): root sends each rank
    // its block, piece by piece, copying its own block during the first send.
    const int64_t piece = comm.max_count();
    if (me != root) {
      for (int64_t off = 0; off < bytes; off += piece)
        co_await comm.Exchange(nullptr, 0, root, out + off, std::min(piece, bytes - off), root, DType::kUInt8,
                               "a scatter");
      co_return;
    }
    const char* own = in + root * bytes;
    bool copied = false;
    auto copy_own = [&] {
      if (!copied && out != own) std::memcpy(out, own, bytes);
      copied = true;
    };
    for (int q = 0; q < comm.size(); ++q) {
      if (q == root) continue;
      for (int64_t off = 0; off < bytes; off += piece) {
        co_await comm.Exchange(in + q * bytes + off, std::min(piece, bytes - off), q, nullptr, 0, q,
                               DType::kUInt8, "a scatter", copy_own);
      }
    }
    copy_own();  // (a set of one rank)
  }
};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Scatter)

}  // namespace jaxcache
