// reducescatter: the reduction of every rank's tensor, split along the first
// dimension; rank r gets block r (the first rows % size ranks one row more).
#include <algorithm>

#include "collectives/collective.h"
#include "operations.h"
#include "reduce_ops.h"

namespace jaxcache {
namespace {

// Pairwise exchanges (Pairwise below) run on up to this many ranks at any
// size, and on more from this many bytes (MPICH's own crossover to pairwise
// exchange); faster than MPI_Ireduce_scatter_block at every size measured
// (benchmarks/README.md, "The runtime's constants").
constexpr int kPairwiseRanks = 4;
constexpr int64_t kPairwiseBytes = 512 << 10;

// A reducescatter as P-1 pairwise exchanges, piece by piece, received into
// the result and reduced (and postscaled) there: no packing copy, no MPI
// temporary, no extra pass over the result.
Task<> Pairwise(Operations& ops, const void* in, void* out, const std::vector<int64_t>& counts,
                DType dtype, ReduceOp op, double prescale, double postscale) {
  Comm& comm = ops.comm();
  const int size = comm.size(), me = comm.rank();
  const std::size_t esize = ElementSize(dtype);
  // Pieces of JAXCACHE_CHUNK_BYTES: 1 and 16 MiB pieces were slower than 4 MiB
  // at 16-100 MB (2 ranks), one piece per block 1.2x slower at 100 MB.
  const int64_t longest = *std::max_element(counts.begin(), counts.end());
  const int64_t per = std::max<int64_t>(1, std::min(comm.ChunkCount(esize), longest));
  const bool scaled = prescale != 1.0;
  char* scratch = nullptr;
  if (size > 2 || scaled) scratch = ops.Scratch(static_cast<std::size_t>(per) * esize * (scaled ? 2 : 1));
  std::vector<int64_t> displ(size, 0);
  for (int q = 1; q < size; ++q) displ[q] = displ[q - 1] + counts[q - 1];
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  op = Reduction(op);
  ++ops.stats().mpi_calls;  // counted per tensor, as the other chunked calls are
  // Piece by piece so that what arrives is reduced while it is in cache. Every
  // rank runs the same pieces and steps in the same order; step k sends to
  // rank me + k the piece of its block and receives from rank me - k the piece
  // of ours.
  for (int64_t off = 0; off < longest; off += per) {
    const int64_t n = std::clamp<int64_t>(counts[me] - off, 0, per);
    char* acc = dst + off * esize;
    for (int k = 1; k < size; ++k) {
      const int to = (me + k) % size, from = (me - k + size) % size;
      const int64_t sn = std::clamp<int64_t>(counts[to] - off, 0, per);
      char* landing = k == 1 ? acc : scratch;
      co_await comm.Exchange(src + (displ[to] + off) * esize, sn, to, landing, n, from, dtype,
                             "a reducescatter");
      if (scaled) Scale(landing, landing, n, dtype, prescale);
      if (k > 1) ReduceLocal(dtype, op, landing, acc, n);
    }
    const char* own = src + (displ[me] + off) * esize;
    if (scaled) {
      char* own_scaled = scratch + per * esize;
      Scale(own, own_scaled, n, dtype, prescale);
      ReduceLocal(dtype, op, own_scaled, acc, n);
    } else {
      ReduceLocal(dtype, op, own, acc, n);
    }
    if (postscale != 1.0) Scale(acc, acc, n, dtype, postscale);  // while the piece is in cache
  }
}

class Reducescatter final : public Collective {
 public:
  Reducescatter()
      : Collective({.checks_reduction = true, .splits_rows = true, .mpi_phase = "MPI_REDUCESCATTER"}) {}
  std::size_t ResultBytes(const Signature&, const TensorSpec& spec, int rank, int size) const override {
    return ScatterRows(spec.Rows(), size, rank) * spec.RowBytes();
  }
  // A joined rank contributes the identity.
  std::string JoinConflict(const Signature&, const Agreement*, const std::vector<bool>&,
                           const std::string&) const override {
    return "";
  }
  void StandInTensor(const Signature& sig, const TensorSpec& t, int rank, int size,
                     StandInRequest& s) const override {
    s.buffers.push_back(OutputStore::Allocate(t.NumBytes(), t.shape));
    char* in = s.buffers.back().data.get();
    FillIdentity(in, t.NumElements(), t.dtype, sig.op);
    s.buffers.push_back(OutputStore::Allocate(ScatterRows(t.Rows(), size, rank) * t.RowBytes(), {}));
    s.request->inputs.push_back(in);
    s.request->outputs.push_back(s.buffers.back().data.get());
  }

  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const Signature& sig = r.sig;
    const TensorSpec& spec = sig.tensors[t];
    const int size = ops.comm().size();
    const int64_t row = static_cast<int64_t>(spec.RowBytes() / ElementSize(spec.dtype));
    std::vector<int64_t> counts(size);
    for (int q = 0; q < size; ++q) counts[q] = ScatterRows(spec.Rows(), size, q) * row;
    const int64_t count = spec.NumElements();
    if (count == 0) co_return;
    ops.stats().bytes_reduced += spec.NumBytes();
    void* out = r.outputs[t];
    AdviseHugePages(out, counts[ops.comm().rank()] * ElementSize(spec.dtype));
    const double post = sig.op == ReduceOp::kAverage ? sig.postscale / ops.AverageDivisor(r) : sig.postscale;
    if (size > 1 && (size <= kPairwiseRanks || static_cast<int64_t>(spec.NumBytes()) >= kPairwiseBytes)) {
      co_await Pairwise(ops, r.inputs[t], out, counts, spec.dtype, sig.op, sig.prescale, post);
      co_return;
    }
    // The input is not copied unless a prescale asks for it; an average's
    // division is applied to the (smaller) result instead.
    const void* in = r.inputs[t];
    if (sig.prescale != 1.0) {
      char* scaled = ops.Scratch(spec.NumBytes());
      Scale(in, scaled, count, spec.dtype, sig.prescale);
      in = scaled;
    }
    ++ops.stats().mpi_calls;
    co_await ops.comm().ReducescatterData(in, out, counts, spec.dtype, sig.op);
    if (post != 1.0) Scale(out, out, counts[ops.comm().rank()], spec.dtype, post);
  }
};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Reducescatter)

}  // namespace jaxcache
