// join: a rank out of data serves the others' collectives until every rank
// has joined (join_state.h; the controller treats its request apart). No
// tensors, no MPI call of its own.
#include "collectives/collective.h"

namespace jaxcache {
namespace {

class Join final : public Tensorless {};

}  // namespace

JAXCACHE_DEFINE_COLLECTIVE(Join)

}  // namespace jaxcache
