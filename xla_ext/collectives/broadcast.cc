// broadcast: every rank gets root's tensors.
#include <cstring>

#include "collectives/collective.h"
#include "operations.h"

namespace jaxcache {
namespace {

class Broadcast final : public Collective {
 public:
  Broadcast() : Collective({.checks_root = true, .in_place = true, .mpi_phase = "MPI_BCAST"}) {}
  std::size_t ResultBytes(const Signature&, const TensorSpec& spec, int, int) const override { return spec.NumBytes(); }
  std::string JoinConflict(const Signature& sig, const Agreement*, const std::vector<bool>& joined,
                           const std::string&) const override {
    return RootJoined(sig, joined, "has no data to send");
  }
  // Receives into scratch.
  void StandInTensor(const Signature&, const TensorSpec& t, int, int, StandInRequest& s) const override {
    s.buffers.push_back(OutputStore::Allocate(t.NumBytes(), t.shape));
    char* p = s.buffers.back().data.get();
    s.request->inputs.push_back(p);
    s.request->outputs.push_back(p);
  }

  // Root copies its operand into its result, which every rank then receives in place.
  Task<> Execute(Operations& ops, Request& r, std::size_t t) const override {
    const std::size_t bytes = r.sig.tensors[t].NumBytes();
    if (bytes == 0) co_return;
    if (ops.comm().rank() == r.sig.root && r.inputs[t] != r.outputs[t])
      std::memcpy(r.outputs[t], r.inputs[t], bytes);
    ++ops.stats().mpi_calls;
    co_await ops.comm().BroadcastData(r.outputs[t], static_cast<int64_t>(bytes), r.sig.root);
  }
};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Broadcast)

}  // namespace jaxcache
