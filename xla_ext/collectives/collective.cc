#include "collectives/collective.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <sstream>

#include "operations.h"
#include "reduce_ops.h"

namespace jaxcache {

// Each collectives/<name>.cc defines <Enumerator>Collective().
#define JAXCACHE_DECLARE_COLLECTIVE(E, name, target) const Collective& E##Collective();
JAXCACHE_KINDS(JAXCACHE_DECLARE_COLLECTIVE)
#undef JAXCACHE_DECLARE_COLLECTIVE

const Collective& CollectiveOf(Kind kind) {
  switch (kind) {
#define JAXCACHE_COLLECTIVE_CASE(E, name, target) \
  case Kind::k##E: return E##Collective();
    JAXCACHE_KINDS(JAXCACHE_COLLECTIVE_CASE)
#undef JAXCACHE_COLLECTIVE_CASE
  }
  // Codes are range-checked where they enter (wire, bindings): unreachable.
  throw std::logic_error("jaxcache: no collective for kind " + std::to_string(static_cast<int>(kind)));
}

Status Collective::Decide(const Checker& c, Agreement*) const {
  if (traits_.checks_root) JAXCACHE_RETURN_IF_ERROR(c.Root());
  if (traits_.checks_reduction) JAXCACHE_RETURN_IF_ERROR(c.Reduction());
  if (traits_.splits_rows) JAXCACHE_RETURN_IF_ERROR(c.NotScalars());
  return c.Tensors();
}

void StandInIdentity(const Signature& sig, const TensorSpec& t, StandInRequest& s) {
  s.buffers.push_back(OutputStore::Allocate(t.NumBytes(), t.shape));
  char* p = s.buffers.back().data.get();
  FillIdentity(p, t.NumElements(), t.dtype, sig.op);
  s.request->inputs.push_back(p);
  s.request->outputs.push_back(p);
}

void StandInNothing(StandInRequest& s) {
  s.request->inputs.push_back(nullptr);
  s.request->outputs.push_back(nullptr);
}

Task<> ReduceByChunks(Operations& ops, Request& r, std::size_t t, Scaling scaling, ChunkReduction reduce) {
  const TensorSpec& spec = r.sig.tensors[t];
  const DType dtype = spec.dtype;
  const std::size_t esize = ElementSize(dtype);
  const int64_t count = spec.NumElements();
  const char* in = static_cast<const char*>(r.inputs[t]);
  char* out = static_cast<char*>(r.outputs[t]);
  if (in != out) AdviseHugePages(out, spec.NumBytes());
  const int64_t step = ops.comm().ChunkCount(esize);
  ++ops.stats().mpi_calls;
  for (int64_t off = 0; off < count; off += step) {
    const int n = static_cast<int>(std::min(step, count - off));
    char* o = out + off * esize;
    CopyScaled(in + off * esize, o, n, dtype, scaling.pre);
    co_await reduce(o, n);
    if (scaling.post != 1.0) Scale(o, o, n, dtype, scaling.post);
  }
}

namespace {

// The pairwise steps' layout: blocks of counts[q] elements laid end to end,
// moved in pieces of at most JAXCACHE_CHUNK_BYTES.
struct PairwiseLayout {
  std::vector<int64_t> displ;  // where each block starts
  int64_t longest;             // the longest block
  int64_t per;                 // elements per piece
};

PairwiseLayout LayoutOf(const Comm& comm, const std::vector<int64_t>& counts, std::size_t esize) {
  PairwiseLayout l{std::vector<int64_t>(counts.size(), 0), *std::max_element(counts.begin(), counts.end()), 0};
  for (std::size_t q = 1; q < counts.size(); ++q) l.displ[q] = l.displ[q - 1] + counts[q - 1];
  l.per = std::max<int64_t>(1, std::min(comm.ChunkCount(esize), l.longest));
  return l;
}

}  // namespace

Task<> PairwiseReducescatter(Operations& ops, const void* in, void* out, const std::vector<int64_t>& counts,
                             DType dtype, ReduceOp op, double prescale, double postscale, const char* what) {
  Comm& comm = ops.comm();
  const int size = comm.size(), me = comm.rank();
  const std::size_t esize = ElementSize(dtype);
  // Pieces of JAXCACHE_CHUNK_BYTES (4 MiB by default: smaller and larger pieces,
  // and one piece per block, were slower) (benchmarks/README.md, "Figures behind the runtime's comments").
  const auto [displ, longest, per] = LayoutOf(comm, counts, esize);
  const bool scaled = prescale != 1.0;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  // In place, this rank's own operand is its accumulator: nothing may land on it.
  const bool own_in_place = src + displ[me] * esize == dst;
  char* scratch = nullptr;
  if (size > 2 || scaled || own_in_place)
    scratch = ops.Scratch(static_cast<std::size_t>(per) * esize * (scaled && !own_in_place ? 2 : 1));
  op = Reduction(op);
  ++ops.stats().mpi_calls;  // counted per tensor, as the other chunked calls are
  // Piece by piece so that what arrives is reduced while it is in cache. Every
  // rank runs the same pieces and steps in the same order; step k sends to
  // rank me + k the piece of its block and receives from rank me - k the piece
  // of ours.
  for (int64_t off = 0; off < longest; off += per) {
    const int64_t n = std::clamp<int64_t>(counts[me] - off, 0, per);
    char* acc = dst + off * esize;
    if (own_in_place && scaled) Scale(acc, acc, n, dtype, prescale);
    for (int k = 1; k < size; ++k) {
      const int to = (me + k) % size, from = (me - k + size) % size;
      const int64_t sn = std::clamp<int64_t>(counts[to] - off, 0, per);
      char* landing = k == 1 && !own_in_place ? acc : scratch;
      co_await comm.Exchange(src + (displ[to] + off) * esize, sn, to, landing, n, from, dtype, what);
      if (scaled) Scale(landing, landing, n, dtype, prescale);
      if (landing != acc) ReduceLocal(dtype, op, landing, acc, n);
    }
    if (!own_in_place) {
      const char* own = src + (displ[me] + off) * esize;
      if (scaled) {
        char* own_scaled = scratch + per * esize;
        Scale(own, own_scaled, n, dtype, prescale);
        ReduceLocal(dtype, op, own_scaled, acc, n);
      } else {
        ReduceLocal(dtype, op, own, acc, n);
      }
    }
    if (postscale != 1.0) Scale(acc, acc, n, dtype, postscale);  // while the piece is in cache
  }
}

Task<> PairwiseAllgather(Operations& ops, void* buf, const std::vector<int64_t>& counts, DType dtype,
                         const char* what) {
  Comm& comm = ops.comm();
  const int size = comm.size(), me = comm.rank();
  const std::size_t esize = ElementSize(dtype);
  const auto [displ, longest, per] = LayoutOf(comm, counts, esize);
  char* base = static_cast<char*>(buf);
  for (int k = 1; k < size; ++k) {
    const int to = (me + k) % size, from = (me - k + size) % size;
    for (int64_t off = 0; off < longest; off += per) {
      const int64_t sn = std::clamp<int64_t>(counts[me] - off, 0, per);
      const int64_t rn = std::clamp<int64_t>(counts[from] - off, 0, per);
      if (sn == 0 && rn == 0) break;
      co_await comm.Exchange(base + (displ[me] + off) * esize, sn, to, base + (displ[from] + off) * esize, rn,
                             from, dtype, what);
    }
  }
}

Task<> PairwiseAllreduce(Operations& ops, const void* in, void* out, int64_t count, DType dtype, ReduceOp op,
                         Scaling scaling) {
  const int size = ops.comm().size();
  std::vector<int64_t> counts(size);
  for (int q = 0; q < size; ++q) counts[q] = ScatterRows(count, size, q);
  const int64_t mine = std::accumulate(counts.begin(), counts.begin() + ops.comm().rank(), int64_t{0});
  char* base = static_cast<char*>(out);
  co_await PairwiseReducescatter(ops, in, base + mine * ElementSize(dtype), counts, dtype, op, scaling.pre,
                                 scaling.post, "an allreduce");
  co_await PairwiseAllgather(ops, out, counts, dtype, "an allreduce");
}

std::string RootJoined(const Signature& sig, const std::vector<bool>& joined, const char* lost) {
  if (!joined[sig.root]) return "";
  return "cannot run: its root, rank " + std::to_string(sig.root) + ", has joined (called join()) and " + lost;
}

namespace {

// "rank 0: float32; ranks 1, 2: float64" -- ranks grouped by value; ranks
// without a value (joined) are left out.
std::string DescribeByRank(const std::vector<std::optional<std::string>>& values) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(values.size()); ++r) {
    if (!values[r]) continue;
    auto it = groups.begin();
    for (; it != groups.end(); ++it)
      if (it->first == *values[r]) break;
    if (it == groups.end()) groups.push_back({*values[r], {r}});
    else it->second.push_back(r);
  }
  std::ostringstream out;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g) out << "; ";
    out << RankList(groups[g].second) << ": " << groups[g].first;
  }
  return out.str();
}

std::string FormatDouble(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

std::string Which(const Signature& s, std::size_t t) {
  return s.tensors.size() == 1 ? "" : " of tensor " + std::to_string(t);
}

// The shape with its first dimension left open: "(*, 3)" (a scalar: "()").
std::string TrailingShape(const TensorSpec& t) {
  std::string s = "(*";
  for (std::size_t i = 1; i < t.shape.size(); ++i) s += ", " + std::to_string(t.shape[i]);
  return s + ")";
}

}  // namespace

Checker::Checker(const std::string& name, const std::vector<const Signature*>& by_rank)
    : name_(name), by_rank_(by_rank) {
  for (const Signature* s : by_rank)
    if (s) {
      first_ = s;
      break;
    }
}

Status Checker::Same(const std::string& field, const Field& key, const Field& shown,
                     const std::function<bool(const Signature&)>& among) const {
  std::vector<std::optional<std::string>> values(by_rank_.size());
  std::optional<std::string> seen;
  bool differs = false;
  for (std::size_t r = 0; r < by_rank_.size(); ++r) {
    if (!by_rank_[r] || (among && !among(*by_rank_[r]))) continue;
    std::string k = key(*by_rank_[r]);
    if (seen && *seen != k) differs = true;
    if (!seen) seen = k;
    values[r] = shown ? shown(*by_rank_[r]) : k;
  }
  if (!differs) return Status::Ok();
  return Error(ErrorKind::kMismatch, field + " differs across ranks (" + DescribeByRank(values) + ")");
}

Status Checker::SameByRank(const std::string& field,
                           const std::function<std::string(int, const Signature&)>& key) const {
  std::vector<std::optional<std::string>> values(by_rank_.size());
  std::optional<std::string> seen;
  bool differs = false;
  for (int r = 0; r < size(); ++r) {
    if (!by_rank_[r]) continue;
    values[r] = key(r, *by_rank_[r]);
    if (seen && *seen != *values[r]) differs = true;
    if (!seen) seen = values[r];
  }
  if (!differs) return Status::Ok();
  return Error(ErrorKind::kMismatch, field + " differs across ranks (" + DescribeByRank(values) + ")");
}

Status Checker::Error(ErrorKind kind, const std::string& what) const {
  return Status::Error(kind, std::string("jaxcache: ") +
                                 (kind == ErrorKind::kMismatch ? "mismatched collective '"
                                                               : "invalid collective '") +
                                 name_ + "' (" + KindName(first_->kind) + "): " + what);
}

Status Checker::Tensors(bool first_dim_may_differ) const {
  const Signature& f = first();
  for (std::size_t t = 0; t < f.tensors.size(); ++t) {
    JAXCACHE_RETURN_IF_ERROR(Same("dtype" + Which(f, t), [t](const Signature& s) {
      return std::string(DTypeName(s.tensors[t].dtype));
    }));
    JAXCACHE_RETURN_IF_ERROR(Same(
        (first_dim_may_differ ? "shape beyond the first dimension" : "shape") + Which(f, t),
        [&](const Signature& s) {
          const TensorSpec& spec = s.tensors[t];
          return first_dim_may_differ && !spec.shape.empty() ? TrailingShape(spec) : spec.ShapeString();
        },
        [t](const Signature& s) { return s.tensors[t].ShapeString(); }));
  }
  return Status::Ok();
}

Status Checker::NotScalars() const {
  for (std::size_t t = 0; t < first().tensors.size(); ++t)
    if (first().tensors[t].shape.empty())
      return Error(ErrorKind::kInvalidArgument,
                   "tensor " + std::to_string(t) + " is a scalar; it needs a first dimension to split");
  return Status::Ok();
}

Status Checker::Reduction() const {
  JAXCACHE_RETURN_IF_ERROR(Same("reduce op", [](const Signature& s) { return std::string(ReduceOpName(s.op)); }));
  JAXCACHE_RETURN_IF_ERROR(Same("prescale", [](const Signature& s) { return FormatDouble(s.prescale); }));
  return Same("postscale", [](const Signature& s) { return FormatDouble(s.postscale); });
}

Status Checker::Root() const {
  JAXCACHE_RETURN_IF_ERROR(Same("root", [](const Signature& s) { return std::to_string(s.root); }));
  if (first().root < 0 || first().root >= size())
    return Status::Error(ErrorKind::kInvalidArgument,
                         std::string("jaxcache: ") + KindName(first().kind) + " '" + name_ + "': root " +
                             std::to_string(first().root) + " is outside [0, " + std::to_string(size()) + ")");
  return Status::Ok();
}

}  // namespace jaxcache
