#include "config.h"

namespace jaxcache {

std::map<std::string, double> Stats::Snapshot() const {
  return {
      {"cycles", double(cycles)},
      {"coordinator_rounds", double(coordinator_rounds)},
      {"bitvector_syncs", double(bitvector_syncs)},
      {"cache_hits", double(cache_hits)},
      {"cache_misses", double(cache_misses)},
      {"cache_evictions", double(cache_evictions)},
      {"cache_invalidations", double(cache_invalidations)},
      {"responses_executed", double(responses_executed)},
      {"fused_responses", double(fused_responses)},
      {"bytes_reduced", double(bytes_reduced)},
      {"mpi_calls", double(mpi_calls)},
      {"stall_warnings", double(stall_warnings)},
      {"cancellations", double(cancellations)},
      {"in_cycle_reductions", double(in_cycle_reductions)},
      {"completed_inline", double(completed_inline)},
      {"p2p_messages", double(p2p_messages)},
      {"p2p_completed_inline", double(p2p_completed_inline)},
      {"transfer_sleeps", double(transfer_sleeps)},
      {"negotiation_seconds", negotiation_seconds.load()},
      {"execution_seconds", execution_seconds.load()},
  };
}

void Stats::Reset() {
  for (auto* c : {&cycles, &coordinator_rounds, &bitvector_syncs, &cache_hits, &cache_misses,
                  &cache_evictions, &cache_invalidations, &responses_executed, &fused_responses,
                  &bytes_reduced, &mpi_calls, &stall_warnings, &cancellations, &in_cycle_reductions,
                  &completed_inline, &p2p_messages, &p2p_completed_inline, &transfer_sleeps})
    c->store(0);
  negotiation_seconds.store(0.0);
  execution_seconds.store(0.0);
}

}  // namespace jaxcache
