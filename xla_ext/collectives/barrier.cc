// barrier: no tensors; every rank submitting it is the synchronization, so
// its negotiation is all of it.
#include "collectives/collective.h"

namespace jaxcache {
namespace {

class Barrier final : public Tensorless {};

}  // namespace

const Collective& BarrierCollective() {
  static const Barrier collective;
  return collective;
}

}  // namespace jaxcache
