// The local levels of an allreduce over this process's devices too
// (Signature::over_devices; `axis_name=` on CPU, jaxcache/ops/hierarchical.py).
// A request from N devices holds each device's tensors in turn. Device
// position p owns block p of every tensor (a 1/N of its elements):
//   1. ReduceBlocks: p's block of the reduction over the N devices, written
//      into p's own result (host memory, no XLA collective);
//   2. Operations reduces each device's block across the processes, in place
//      (one block per device: 1/N of the tensor crosses processes per device);
//   3. GatherBlocks: each block copied into the other devices' results.
// Every device then holds the reduction over every device of every process,
// the same bits on every device and every rank.
#pragma once

#include <cstdint>

#include "request.h"

namespace jaxcache {

// Elements [first, first + count) of a tensor of `count_all` are device
// `position`'s of `devices` (the first blocks are one element longer when
// they do not divide evenly).
struct Block {
  int64_t first = 0;
  int64_t count = 0;
};
Block BlockOf(int64_t count_all, int devices, int position);

// Whether `r` reduces over several devices: the runtime's local levels apply.
inline bool ReducesOverDevices(const Request& r) { return r.sig.over_devices && r.sig.devices > 1; }

// Step 1: for every tensor, device position p's result gets, in its block p,
// the reduction (r.sig.op) of every device's operand there. A result may
// alias its own operand (XLA in place): p writes only block p of its own
// buffer, which no other device's block reads.
void ReduceBlocks(Request& r);

// Step 3: every device's reduced block copied into every other device's result.
void GatherBlocks(Request& r);

}  // namespace jaxcache
