// alltoall: rank r sends block d of its first dimension to rank d and gets
// block r of every rank, in rank order; blocks are equal unless the ranks pass
// splits (rows per destination, eagerly).
#include <algorithm>

#include "collectives/collective.h"
#include "operations.h"

namespace jaxcache {
namespace {

std::string Join(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// One tensor, or one per device of a program over several devices: those
// are the same shape and split into equal blocks (the rows agreed for the
// first serve them all).
Status OneTensorPerDevice(const Checker& c) {
  const Signature& first = c.first();
  if (first.tensors.size() != static_cast<std::size_t>(first.devices))
    return c.Error(ErrorKind::kInvalidArgument, "alltoall takes exactly one tensor");
  if (first.devices == 1) return Status::Ok();
  Status bad;
  c.ForEachRank([&](int r, const Signature& s) {
    if (!bad.ok()) return;
    if (!s.splits.empty())
      bad = c.Error(ErrorKind::kInvalidArgument, "splits are for one device per process (rank " +
                                                     std::to_string(r) + " passed them on " +
                                                     std::to_string(s.devices) + " devices)");
    for (const TensorSpec& t : s.tensors)
      if (!(t == s.tensors.front()))
        bad = c.Error(ErrorKind::kMismatch, "rank " + std::to_string(r) + "'s devices pass different shapes");
  });
  return bad;
}

class Alltoall final : public RowMovement {
 public:
  Alltoall() : RowMovement({.agreed_sizes = true, .mpi_phase = "MPI_ALLTOALL"}) {}
  // Agreement: rows[s * size + d] = rows rank s sends to rank d.
  Status Decide(const Checker& c, Agreement* agreement) const override {
    JAXCACHE_RETURN_IF_ERROR(OneTensorPerDevice(c));
    JAXCACHE_RETURN_IF_ERROR(c.NotScalars());
    JAXCACHE_RETURN_IF_ERROR(c.Tensors(true));
    const int size = c.size();
    // Ranks without splits send equal blocks; those with splits must agree on their number.
    JAXCACHE_RETURN_IF_ERROR(c.Same(
        "number of splits", [](const Signature& s) { return std::to_string(s.splits.size()); }, nullptr,
        [](const Signature& s) { return !s.splits.empty(); }));
    Status bad;
    agreement->rows.assign(static_cast<std::size_t>(size) * size, 0);
    c.ForEachRank([&](int r, const Signature& s) {
      if (!bad.ok()) return;
      const int64_t rows = s.tensors[0].shape[0];
      int64_t* out = &agreement->rows[static_cast<std::size_t>(r) * size];
      if (s.splits.empty()) {
        if (rows % size != 0) {
          bad = c.Error(ErrorKind::kInvalidArgument,
                        "rank " + std::to_string(r) + "'s first dimension " + std::to_string(rows) +
                            " does not split into " + std::to_string(size) +
                            " equal blocks; pass splits (eagerly) or make it divisible");
          return;
        }
        std::fill(out, out + size, rows / size);
        return;
      }
      if (static_cast<int>(s.splits.size()) != size) {
        bad = c.Error(ErrorKind::kMismatch,
                      "rank " + std::to_string(r) + " passed " + std::to_string(s.splits.size()) +
                          " splits but there are " + std::to_string(size) + " ranks");
        return;
      }
      int64_t sum = 0;
      for (int d = 0; d < size; ++d) {
        if (s.splits[d] < 0) {
          bad = c.Error(ErrorKind::kInvalidArgument,
                        "rank " + std::to_string(r) + "'s splits " + Join(s.splits) + " contain a negative count");
          return;
        }
        out[d] = s.splits[d];
        sum += s.splits[d];
      }
      if (sum != rows)
        bad = c.Error(ErrorKind::kInvalidArgument,
                      "rank " + std::to_string(r) + "'s splits " + Join(s.splits) + " sum to " +
                          std::to_string(sum) + " but its first dimension is " + std::to_string(rows));
    });
    JAXCACHE_RETURN_IF_ERROR(bad);
    // Outputs sized like the input (jit) must receive exactly that many rows.
    c.ForEachRank([&](int r, const Signature& s) {
      agreement->static_shapes |= s.static_shapes;
      if (!bad.ok() || !s.static_shapes) return;
      int64_t received = 0;
      for (int src = 0; src < size; ++src) received += agreement->rows[static_cast<std::size_t>(src) * size + r];
      if (received != s.tensors[0].shape[0])
        bad = c.Error(ErrorKind::kMismatch,
                      "rank " + std::to_string(r) + " would receive " + std::to_string(received) +
                          " rows but its result (equal blocks, e.g. under jit) has " +
                          std::to_string(s.tensors[0].shape[0]));
    });
    return bad;
  }
  std::size_t ResultBytes(const Signature&, const TensorSpec& spec, int, int) const override { return spec.NumBytes(); }
  std::string JoinConflict(const Signature&, const Agreement*, const std::vector<bool>&,
                           const std::string& who) const override {
    return "cannot run while " + who + " joined: the rows sent to a joined rank would be lost";
  }

  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const TensorSpec& spec = r.sig.tensors[t];
    const int size = ops.comm().size(), me = ops.comm().rank();
    const int64_t row = static_cast<int64_t>(spec.RowBytes());
    // rows[s * size + d]: rows rank s sends to rank d (rank 0 checked them).
    std::vector<int64_t> rows(static_cast<std::size_t>(size) * size, spec.Rows() / size);
    if (r.agreement && r.agreement->rows.size() == rows.size()) rows = r.agreement->rows;
    std::vector<int64_t> received(size), bytes(rows.size());
    int64_t total = 0;
    for (int q = 0; q < size; ++q) {
      received[q] = rows[static_cast<std::size_t>(q) * size + me];
      total += received[q];
    }
    for (std::size_t i = 0; i < rows.size(); ++i) bytes[i] = rows[i] * row;
    char* out = ops.Output(r, t, total * row, WithRows(spec, total));
    if (r.store) r.store->rows = received;
    if (std::all_of(bytes.begin(), bytes.end(), [](int64_t n) { return n == 0; })) co_return;
    ++ops.stats().mpi_calls;
    co_await ops.comm().AlltoallData(r.inputs[t], out, bytes);
  }
};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Alltoall)

}  // namespace jaxcache
