// barrier: no tensors; every rank submitting it is the synchronization, so
// its negotiation is all of it.
#include "collectives/collective.h"

namespace jaxcache {
namespace {

class Barrier final : public Tensorless {};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Barrier)

}  // namespace jaxcache
