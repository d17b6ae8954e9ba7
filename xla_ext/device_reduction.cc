#include "device_reduction.h"

#include <cstring>

#include "reduce_ops.h"

namespace jaxcache {

Block BlockOf(int64_t count_all, int devices, int position) {
  const int64_t base = count_all / devices, extra = count_all % devices;
  Block b;
  b.count = base + (position < extra ? 1 : 0);
  b.first = position * base + (position < extra ? position : extra);
  return b;
}

namespace {

// Tensor `k` of device position `p` in a request of `per` tensors per device.
std::size_t TensorOf(int p, std::size_t k, std::size_t per) { return p * per + k; }

const char* At(const void* base, int64_t first, std::size_t esize) {
  return static_cast<const char*>(base) + first * esize;
}
char* At(void* base, int64_t first, std::size_t esize) { return static_cast<char*>(base) + first * esize; }

// Calls fn(tensor k, position p, p's block of k, element size) for every
// nonempty block of every tensor (r.sig.devices positions, each holding the
// request's tensors in turn).
template <typename Fn>
void ForEachBlock(const Request& r, Fn fn) {
  const int n = r.sig.devices;
  const std::size_t per = r.sig.tensors.size() / n;
  for (std::size_t k = 0; k < per; ++k) {
    const TensorSpec& spec = r.sig.tensors[k];
    for (int p = 0; p < n; ++p) {
      const Block b = BlockOf(spec.NumElements(), n, p);
      if (b.count > 0) fn(k, p, b, ElementSize(spec.dtype));
    }
  }
}

}  // namespace

void ReduceBlocks(Request& r) {
  const int n = r.sig.devices;
  const std::size_t per = r.sig.tensors.size() / n;
  ForEachBlock(r, [&](std::size_t k, int p, const Block& b, std::size_t esize) {
    char* acc = At(r.outputs[TensorOf(p, k, per)], b.first, esize);
    // Start from p's own operand: nothing to copy when XLA aliased it with the result.
    const char* own = At(r.inputs[TensorOf(p, k, per)], b.first, esize);
    if (own != acc) std::memcpy(acc, own, b.count * esize);
    for (int q = 0; q < n; ++q)
      if (q != p) ReduceLocal(r.sig.tensors[k].dtype, r.sig.op, At(r.inputs[TensorOf(q, k, per)], b.first, esize), acc,
                              b.count);
  });
}

void GatherBlocks(Request& r) {
  const int n = r.sig.devices;
  const std::size_t per = r.sig.tensors.size() / n;
  ForEachBlock(r, [&](std::size_t k, int p, const Block& b, std::size_t esize) {
    const char* reduced = At(static_cast<const void*>(r.outputs[TensorOf(p, k, per)]), b.first, esize);
    for (int q = 0; q < n; ++q)
      if (q != p) std::memcpy(At(r.outputs[TensorOf(q, k, per)], b.first, esize), reduced, b.count * esize);
  });
}

}  // namespace jaxcache
