// allgather: every rank gets every rank's rows of each tensor, in rank order;
// the first dimension may differ between ranks unless the results were sized
// for equal shapes (under jit).
#include "collectives/collective.h"
#include "operations.h"

namespace jaxcache {
namespace {

class Allgather final : public Collective {
 public:
  Allgather() : Collective({.agreed_sizes = true, .mpi_phase = "MPI_ALLGATHER"}) {}
  // Agreement: rows[t * size + r] = rank r's first dimension of tensor t.
  Status Decide(const Checker& c, Agreement* agreement) const override {
    bool any_static = false;
    c.ForEachRank([&](int, const Signature& s) { any_static |= s.static_shapes; });
    // Outputs sized for equal shapes (jit) need equal shapes; else only the
    // first dimension may differ.
    JAXCACHE_RETURN_IF_ERROR(c.Tensors(!any_static));
    const std::size_t n = c.first().tensors.size();
    agreement->static_shapes = any_static;
    agreement->rows.assign(n * c.size(), 0);
    c.ForEachRank([&](int r, const Signature& s) {
      for (std::size_t t = 0; t < n; ++t) agreement->rows[t * c.size() + r] = s.tensors[t].Rows();
    });
    return Status::Ok();
  }
  std::size_t ResultBytes(const Signature&, const TensorSpec& spec, int, int size) const override {
    return spec.NumBytes() * size;
  }
  std::string JoinConflict(const Signature&, const Agreement* agreement, const std::vector<bool>&,
                           const std::string& who) const override {
    if (!agreement || !agreement->static_shapes) return "";
    return "cannot run while " + who +
           " joined: its result is sized for every rank's rows (under jit, or with "
           "preallocated outputs) but joined ranks contribute none; gather eagerly";
  }
  // No rows in; the executor allocates the result.
  void StandInTensor(const Signature&, const TensorSpec&, int, int, StandInRequest& s) const override {
    StandInNothing(s);
  }

  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const TensorSpec& spec = r.sig.tensors[t];
    const int size = ops.comm().size();
    const int64_t row = static_cast<int64_t>(spec.RowBytes());
    // Bytes from each rank: as agreed (joined ranks: none), else equal shapes.
    std::vector<int64_t> rows(size, spec.Rows());
    const Agreement* agreed = r.agreement.get();
    if (agreed && agreed->rows.size() >= (t + 1) * size)
      for (int q = 0; q < size; ++q) rows[q] = agreed->rows[t * size + q];
    std::vector<int64_t> bytes(size);
    int64_t total = 0, total_rows = 0;
    bool equal = true;
    for (int q = 0; q < size; ++q) {
      bytes[q] = rows[q] * row;
      total += bytes[q];
      total_rows += rows[q];
      equal &= rows[q] == rows[0];
    }
    char* out = ops.Output(r, t, total, WithRows(spec, total_rows));
    if (r.store && agreed) r.store->rows = agreed->rows;
    if (r.store) r.store->contributors = ops.Contributors(r);
    if (total == 0) co_return;
    ++ops.stats().mpi_calls;
    if (equal) co_await ops.comm().AllgatherData(r.inputs[t], out, bytes[0]);
    else co_await ops.comm().AllgathervData(r.inputs[t], out, bytes);
  }
};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Allgather)

}  // namespace jaxcache
