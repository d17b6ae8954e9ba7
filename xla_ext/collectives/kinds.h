// Every collective kind, in the order of its wire code (append only: the code
// is the position). X(Enumerator, name, Target) with Target one of
//  - kXla:     an XLA FFI target "jaxcache_<name>" (CPU and CUDA);
//  - kRuntime: none (submitted through the runtime's own calls, without tensors).
// Each kind's behaviour lives in collectives/<name>.cc (collective.h).
#pragma once

#define JAXCACHE_KINDS(X)                  \
  X(Allreduce, "allreduce", kXla)         \
  X(Broadcast, "broadcast", kXla)         \
  X(Allgather, "allgather", kXla)         \
  X(Barrier, "barrier", kXla)             \
  X(Reducescatter, "reducescatter", kXla) \
  X(Alltoall, "alltoall", kXla)           \
  X(Join, "join", kRuntime)               \
  X(Reduce, "reduce", kXla)               \
  X(Scan, "scan", kXla)                   \
  X(Gather, "gather", kXla)               \
  X(Scatter, "scatter", kXla)

// JAXCACHE_IF_XLA(target, code): `code` for the kinds with an XLA target only.
#define JAXCACHE_IF_XLA_kXla(...) __VA_ARGS__
#define JAXCACHE_IF_XLA_kRuntime(...)
#define JAXCACHE_IF_XLA(target, ...) JAXCACHE_IF_XLA_##target(__VA_ARGS__)
