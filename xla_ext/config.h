// Runtime settings (parsed and validated by the Python layer from the
// JAXCACHE_* environment variables; rank 0's values, synchronized at init)
// and the counters behind jaxcache.stats().
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <string>

namespace jaxcache {

struct Config {
  int64_t cache_capacity = 1024;
  double cycle_time_ms = 0.0;           // minimum spacing of busy cycles
  int64_t fusion_threshold = 64 << 20;  // bytes per fusion buffer
  int64_t direct_threshold = 1 << 20;   // tensors this large skip the fusion buffer
  bool group_fusion = true;             // fuse different responses together
  double stall_check_s = 60.0;          // 0 disables warnings
  double stall_shutdown_s = 0.0;        // 0 = never
  double heartbeat_ms = 100.0;          // idle cycle period
  int64_t max_mpi_count = INT_MAX;      // largest element count of one MPI call
  // Allreduces and broadcasts move at most this many bytes per MPI call (0: no
  // limit): a reduction of a few MiB runs from cache, one of 64 MiB from memory
  // (measured 3x slower per byte on 2 ranks, docs/design.md).
  int64_t chunk_bytes = 4 << 20;
  double inline_spin_us = 50.0;         // how long a submitter drives cycles itself
  std::string timeline_path;
  bool timeline_mark_cycles = false;
  std::string fault_inject;             // test-only, see fault_injection.h
};

struct Stats {
  std::atomic<int64_t> cycles{0}, coordinator_rounds{0}, bitvector_syncs{0}, cache_hits{0},
      cache_misses{0}, cache_evictions{0}, cache_invalidations{0}, responses_executed{0},
      fused_responses{0}, bytes_reduced{0}, mpi_calls{0}, stall_warnings{0}, cancellations{0},
      in_cycle_reductions{0};
  std::atomic<double> negotiation_seconds{0.0}, execution_seconds{0.0};

  static void Add(std::atomic<double>& counter, double s) {
    double cur = counter.load();
    while (!counter.compare_exchange_weak(cur, cur + s)) {
    }
  }
  void AddNegotiation(double s) { Add(negotiation_seconds, s); }
  void AddExecution(double s) { Add(execution_seconds, s); }
  std::map<std::string, double> Snapshot() const;
  void Reset();
};

}  // namespace jaxcache
