// Runtime settings (defined here; parsed and validated by the Python layer from
// the JAXCACHE_* environment variables, rank 0's values synchronized at init)
// and the counters behind jaxcache.stats().
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <string>
#include <variant>

#include "enums.h"

namespace jaxcache {

// How a setting's environment variable is read (jaxcache/config.py parses them).
// kInvertedFlag: the variable turns the setting off (JAXCACHE_DISABLE_...).
#define JAXCACHE_SETTING_TYPES(X) \
  X(Int, "int") X(Float, "float") X(Flag, "flag") X(InvertedFlag, "inverted_flag") X(String, "string")
JAXCACHE_DEFINE_ENUM(SettingType, JAXCACHE_SETTING_TYPES)
// kAgreed: rank 0's value is used on every rank (it shapes the cycle, the MPI
// calls or the timing, which must match everywhere); kLocal: each rank its own.
#define JAXCACHE_SETTING_SCOPES(X) X(Agreed, "agreed") X(Local, "local")
JAXCACHE_DEFINE_ENUM(SettingScope, JAXCACHE_SETTING_SCOPES)

// Every runtime setting, once: field, C++ type, default, how it is read, its
// environment variable, the smallest value accepted, its scope. The struct
// below, the Python Config, the environment parser and the documentation
// check are all generated from this list.
#define JAXCACHE_SETTINGS(X)                                                                     \
  X(cache_capacity, int64_t, 1024, kInt, "JAXCACHE_CACHE_CAPACITY", 0, kAgreed)                  \
  /* minimum spacing of busy cycles */                                                           \
  X(cycle_time_ms, double, 0.0, kFloat, "JAXCACHE_CYCLE_TIME", 0, kAgreed)                       \
  /* bytes per fusion buffer */                                                                  \
  X(fusion_threshold, int64_t, 64 << 20, kInt, "JAXCACHE_FUSION_THRESHOLD", 1, kAgreed)          \
  /* tensors this large skip the fusion buffer; 0: by the set's size (operations.cc) */          \
  X(direct_threshold, int64_t, 0, kInt, "JAXCACHE_DIRECT_THRESHOLD", 0, kAgreed)                 \
  /* fuse different responses together */                                                        \
  X(group_fusion, bool, true, kInvertedFlag, "JAXCACHE_DISABLE_GROUP_FUSION", 0, kAgreed)        \
  /* 0 disables warnings */                                                                      \
  X(stall_check_s, double, 60.0, kFloat, "JAXCACHE_STALL_CHECK_TIME", 0, kAgreed)                \
  /* 0 = never */                                                                                \
  X(stall_shutdown_s, double, 0.0, kFloat, "JAXCACHE_STALL_SHUTDOWN_TIME", 0, kAgreed)           \
  /* idle cycle period */                                                                        \
  X(heartbeat_ms, double, 100.0, kFloat, "JAXCACHE_HEARTBEAT_MS", 1, kAgreed)                    \
  /* only rank 0 writes the timeline */                                                          \
  X(timeline_path, std::string, "", kString, "JAXCACHE_TIMELINE", 0, kLocal)                     \
  X(timeline_mark_cycles, bool, false, kFlag, "JAXCACHE_TIMELINE_MARK_CYCLES", 0, kLocal)        \
  /* largest element count of one MPI call */                                                    \
  X(max_mpi_count, int64_t, INT_MAX, kInt, "JAXCACHE_MAX_MPI_COUNT", 1, kAgreed)                 \
  /* allreduces and broadcasts move at most this many bytes per MPI call (0: no limit): a */     \
  /* reduction of a few MiB runs from cache, one of 64 MiB from memory (docs/design.md) */       \
  X(chunk_bytes, int64_t, 4 << 20, kInt, "JAXCACHE_CHUNK_BYTES", 0, kAgreed)                     \
  /* how long shutdown() waits for the other ranks (read by Python) */                           \
  X(shutdown_timeout_s, double, 30.0, kFloat, "JAXCACHE_SHUTDOWN_TIMEOUT", 0, kAgreed)           \
  /* how long a submitter drives cycles itself */                                                \
  X(inline_spin_us, double, 50.0, kFloat, "JAXCACHE_INLINE_SPIN_US", 0, kAgreed)                 \
  /* after join(), an average divides by the set's size (Horovod, torch DDP) or, 0, by the */  \
  /* ranks that have not joined */                                                               \
  X(join_average_by_size, bool, true, kFlag, "JAXCACHE_JOIN_AVERAGE_BY_SIZE", 0, kAgreed)        \
  /* test-only, see fault_injection.h */                                                         \
  X(fault_inject, std::string, "", kString, "JAXCACHE_FAULT_INJECT", 0, kAgreed)                 \
  /* the process's allocator, applied at import (jaxcache/allocator.py) */                       \
  X(malloc_tuning, bool, true, kFlag, "JAXCACHE_MALLOC_TUNING", 0, kLocal)

struct Config {
#define JAXCACHE_SETTING_FIELD(name, type, default_value, ...) type name = default_value;
  JAXCACHE_SETTINGS(JAXCACHE_SETTING_FIELD)
#undef JAXCACHE_SETTING_FIELD
};

// Horovod's variable for a setting, read (with the same meaning and units) when the
// JAXCACHE_* one is unset, so that jobs tuned for horovodrun keep their tuning.
#define JAXCACHE_HOROVOD_ALIASES(X)                         \
  X(cache_capacity, "HOROVOD_CACHE_CAPACITY")               \
  X(cycle_time_ms, "HOROVOD_CYCLE_TIME")                    \
  X(fusion_threshold, "HOROVOD_FUSION_THRESHOLD")           \
  X(group_fusion, "HOROVOD_DISABLE_GROUP_FUSION")           \
  X(stall_check_s, "HOROVOD_STALL_CHECK_TIME_SECONDS")      \
  X(stall_shutdown_s, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS") \
  X(timeline_path, "HOROVOD_TIMELINE")                      \
  X(timeline_mark_cycles, "HOROVOD_TIMELINE_MARK_CYCLES")

// Every counter behind jaxcache.stats(), once (README.md says what each counts).
// Counts are integers; the timers below them are seconds.
#define JAXCACHE_STAT_COUNTS(X)                                                                \
  X(cycles) X(coordinator_rounds) X(bitvector_syncs) X(cache_hits) X(cache_misses)             \
  X(cache_evictions) X(cache_invalidations) X(responses_executed) X(fused_responses)           \
  X(bytes_reduced) X(mpi_calls) X(stall_warnings) X(cancellations) X(in_cycle_reductions)      \
  X(completed_inline) X(completion_wakeups) X(p2p_messages) X(p2p_completed_inline)            \
  X(transfer_sleeps) X(burst_holds) X(device_requests) X(device_parts)
#define JAXCACHE_STAT_SECONDS(X) X(negotiation_seconds) X(execution_seconds)

struct Stats {
#define JAXCACHE_STAT_COUNT_FIELD(name) std::atomic<int64_t> name{0};
  JAXCACHE_STAT_COUNTS(JAXCACHE_STAT_COUNT_FIELD)
#undef JAXCACHE_STAT_COUNT_FIELD
#define JAXCACHE_STAT_SECONDS_FIELD(name) std::atomic<double> name{0.0};
  JAXCACHE_STAT_SECONDS(JAXCACHE_STAT_SECONDS_FIELD)
#undef JAXCACHE_STAT_SECONDS_FIELD

  static void Add(std::atomic<double>& counter, double s) {
    double cur = counter.load();
    while (!counter.compare_exchange_weak(cur, cur + s)) {
    }
  }
  void AddNegotiation(double s) { Add(negotiation_seconds, s); }
  void AddExecution(double s) { Add(execution_seconds, s); }
  std::map<std::string, std::variant<int64_t, double>> Snapshot() const;
  void Reset();
};

}  // namespace jaxcache
