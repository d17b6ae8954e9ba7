#include "operations.h"

#include <algorithm>
#include <cstring>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <map>
#include <stdexcept>
#include <tuple>

#include "collectives/collective.h"
#include "device_reduction.h"
#include "reduce_ops.h"

namespace jaxcache {

namespace {
// Small tensors that may share one fusion buffer: same dtype, op and scales.
using FusionKey = std::tuple<DType, ReduceOp, double, double>;

// Where an allreduce tensor leaves the fusion buffer to be reduced on its own
// when JAXCACHE_DIRECT_THRESHOLD is 0 (the default), measured at 2 ranks
// (benchmarks/README.md, "The runtime's constants"). Up to kPairwiseRanks
// ranks a tensor on its own moves by pairwise exchanges straight from its
// operand, which beats the fusion buffer's two copies from about 48 KB; on more
// ranks MPI reduces it in place after a copy into the result, worth it from 1 MiB.
constexpr int64_t kPairwiseDirectBytes = 48 << 10;
constexpr int64_t kMpiDirectBytes = 1 << 20;
// Tensors already in their result buffer go direct from this size at most: no
// copy into the result is left to save.
constexpr int64_t kInPlaceDirectBytes = 512 << 10;

}  // namespace

// Result buffers fresh from XLA's allocator are first touched by the copy into
// them or by MPI. Faulted in 4 KiB pages they cost more than the collective
// itself (benchmarks/README.md, "Figures behind the runtime's comments"). NumPy asks for transparent huge pages for large
// arrays and XLA does not, so ask here: a hint that changes only the page size
// of later faults (with THP "madvise" mode, the common default).
void AdviseHugePages(void* p, std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = 2 << 20;
  if (bytes < 2 * kHuge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
}

void CopyScaled(const void* in, void* out, int64_t count, DType dtype, double factor) {
  if (factor == 1.0) {
    if (in != out) std::memcpy(out, in, count * ElementSize(dtype));
  } else {
    Scale(in, out, count, dtype, factor);
  }
}

void Operations::Dequeue(Job& t) {
  if (!timeline_.enabled() || !t.queued) return;
  timeline_.End(t.request->name, "QUEUE");
  t.queued = false;
}

void Operations::PhaseAll(std::vector<Job>& jobs, const std::vector<Item>& items,
                          const char* phase, bool begin) {
  if (!timeline_.enabled()) return;
  std::size_t last = SIZE_MAX;
  for (const Item& it : items) {
    if (it.job == last) continue;
    last = it.job;
    const std::string& name = jobs[it.job].request->name;
    begin ? timeline_.Begin(name, phase) : timeline_.End(name, phase);
  }
}

Task<> Operations::Step(std::vector<Job>& jobs, std::vector<std::size_t> touched,
                        std::function<Task<>()> step) {
  std::string failure;
  try {
    co_await step();
    for (std::size_t i : touched)
      if (faults_.Fire(FaultPoint::kData, jobs[i].request->name))
        throw std::runtime_error("MPI call failed (injected fault)");
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (failure.empty()) co_return;
  for (std::size_t i : touched) {
    Job& t = jobs[i];
    std::string what = "jaxcache: data movement of '" + t.request->name + "' failed on rank " +
                       std::to_string(comm_.rank()) + ": " + failure;
    if (first_failure_.empty()) first_failure_ = what;
    if (t.status.ok()) t.status = Status::Error(ErrorKind::kInternal, what);
  }
}

void Operations::Done(Job& t) {
  if (--t.remaining > 0) return;
  Dequeue(t);
  if (ReducesOverDevices(*t.request)) {
    timeline_.Begin(t.request->name, "LOCAL_GATHER");
    GatherBlocks(*t.request);
    timeline_.End(t.request->name, "LOCAL_GATHER");
  }
  ++stats_.responses_executed;
  complete_(t.request, t.status);
}

Task<std::string> Operations::Execute(const std::vector<Request*>& work, Complete complete) {
  complete_ = std::move(complete);
  first_failure_.clear();
  std::vector<Job> jobs;
  jobs.reserve(work.size());
  for (Request* r : work) jobs.push_back({r});
  std::vector<std::size_t> fused, others;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    (CollectiveOf(jobs[i].request->sig.kind).Fused() ? fused : others).push_back(i);
  if (!fused.empty()) co_await Allreduce(jobs, fused);
  for (std::size_t i : others) {
    Job& t = jobs[i];
    Request& r = *t.request;
    const Collective& collective = CollectiveOf(r.sig.kind);
    Dequeue(t);
    // A barrier's or a join's negotiation was the synchronization: no MPI call.
    if (const char* phase = collective.MpiPhase()) {
      timeline_.Begin(r.name, phase);
      for (std::size_t k = 0; k < r.sig.tensors.size(); ++k)
        co_await Step(jobs, std::vector<std::size_t>(1, i),
                      [&, k]() { return collective.Execute(*this, r, k); });
      timeline_.End(r.name, phase);
    }
    t.remaining = 1;
    Done(t);
  }
  complete_ = nullptr;
  co_return first_failure_;
}

Task<> Operations::Allreduce(std::vector<Job>& jobs, const std::vector<std::size_t>& which) {
  AllreducePlan plan = PlanAllreduce(jobs, which);
  // Zero-size requests are complete already.
  for (std::size_t ti : which)
    if (jobs[ti].remaining == 0) {
      jobs[ti].remaining = 1;
      Done(jobs[ti]);
    }
  for (const auto& chunk : plan.chunks) {
    std::vector<std::size_t> touched;
    for (const Item& it : chunk)
      if (touched.empty() || touched.back() != it.job) touched.push_back(it.job);
    co_await Step(jobs, touched, [&]() { return FusedAllreduce(jobs, chunk); });
    for (std::size_t ti : touched) Done(jobs[ti]);
  }
  for (const Item& item : plan.direct) {
    co_await Step(jobs, std::vector<std::size_t>(1, item.job), [&]() { return DirectAllreduce(jobs[item.job], item); });
    Done(jobs[item.job]);
  }
}

// Small tensors go to fusion buckets keyed by (dtype, op, scales) in order of
// first appearance; large ones are reduced directly from the input into the
// output, which costs no copy at all. Counts each job's steps.
Operations::AllreducePlan Operations::PlanAllreduce(std::vector<Job>& jobs, const std::vector<std::size_t>& which) {
  std::vector<FusionKey> key_order;
  std::map<FusionKey, std::vector<Item>> buckets;
  AllreducePlan plan;
  for (std::size_t ti : which) {
    const Signature& sig = jobs[ti].request->sig;
    ItemsOf(jobs, ti, items_);
    for (const Item& item : items_) {
      if (item.count == 0) continue;
      stats_.bytes_reduced += item.bytes;
      // A tensor reduced in its own buffer (XLA aliased a donated operand with
      // its result) goes direct from a lower size: fusing it would add two copies.
      const bool in_place = item.in == item.out;
      const int64_t threshold = in_place ? std::min(DirectThreshold(), kInPlaceDirectBytes) : DirectThreshold();
      if (static_cast<int64_t>(item.bytes) >= threshold) {
        ++jobs[ti].remaining;
        plan.direct.push_back(item);
        continue;
      }
      const Scaling scaling = ScalingFor(*jobs[ti].request, item.tensor);
      FusionKey key{sig.tensors[item.tensor].dtype, sig.op, scaling.pre, scaling.post};
      auto& bucket = buckets[key];
      if (bucket.empty()) key_order.push_back(key);
      bucket.push_back(item);
    }
  }
  for (const FusionKey& key : key_order) AppendChunks(jobs, buckets[key], &plan.chunks);
  return plan;
}

// Splits a bucket into chunks of at most fusion_threshold bytes (and, without
// group fusion, never across requests); counts each job's chunks. A chunk also
// stays within the MPI chunk size: copied in, reduced and copied out while it
// is still in cache.
void Operations::AppendChunks(std::vector<Job>& jobs, const std::vector<Item>& items,
                              std::vector<std::vector<Item>>* chunks) {
  std::size_t chunk_cap = static_cast<std::size_t>(config_.fusion_threshold);
  if (config_.chunk_bytes > 0) chunk_cap = std::min(chunk_cap, static_cast<std::size_t>(config_.chunk_bytes));
  std::size_t begin = 0;
  while (begin < items.size()) {
    std::size_t end = begin, bytes = 0;
    while (end < items.size() &&
           (end == begin || (bytes + items[end].bytes <= chunk_cap &&
                             (config_.group_fusion || items[end].job == items[begin].job)))) {
      bytes += items[end].bytes;
      ++end;
    }
    chunks->emplace_back(items.begin() + begin, items.begin() + end);
    std::size_t last = SIZE_MAX;
    for (const Item& it : chunks->back()) {
      if (it.job != last) ++jobs[it.job].remaining;
      last = it.job;
    }
    begin = end;
  }
}

void Operations::ItemsOf(std::vector<Job>& jobs, std::size_t job, std::vector<Item>& items) {
  Request& r = *jobs[job].request;
  items.clear();
  const bool blocks = ReducesOverDevices(r);
  if (blocks) {
    Dequeue(jobs[job]);
    timeline_.Begin(r.name, "LOCAL_REDUCE");
    ReduceBlocks(r);
    timeline_.End(r.name, "LOCAL_REDUCE");
  }
  const std::size_t per = r.sig.tensors.size() / r.sig.devices;
  for (std::size_t t = 0; t < r.sig.tensors.size(); ++t) {
    const TensorSpec& spec = r.sig.tensors[t];
    const std::size_t esize = ElementSize(spec.dtype);
    if (!blocks) {
      items.push_back({job, t, spec.NumElements(), spec.NumBytes(), r.inputs[t], r.outputs[t]});
      continue;
    }
    const Block b = BlockOf(spec.NumElements(), r.sig.devices, static_cast<int>(t / per));
    char* at = static_cast<char*>(r.outputs[t]) + b.first * esize;
    items.push_back({job, t, b.count, b.count * esize, at, at, /*block=*/true});
  }
}

Task<> Operations::FusedAllreduce(std::vector<Job>& jobs, const std::vector<Item>& items) {
  if (items.size() == 1) {  // nothing to fuse: reduce in place, no copies
    co_await DirectAllreduce(jobs[items[0].job], items[0]);
    co_return;
  }
  const Request& r0 = *jobs[items[0].job].request;
  const Signature& sig0 = r0.sig;
  // The same for every item (the fusion key).
  const Scaling scaling = ScalingFor(r0, items[0].tensor);
  DType dtype = sig0.tensors[items[0].tensor].dtype;
  std::size_t total = 0;
  for (const Item& it : items) total += it.bytes;
  for (const Item& it : items) Dequeue(jobs[it.job]);
  if (fusion_buffer_.size() < total) fusion_buffer_.resize(total);
  char* buf = fusion_buffer_.data();
  PhaseAll(jobs, items, "MEMCPY_IN_FUSION_BUFFER", true);
  std::size_t off = 0;
  for (const Item& it : items) {
    CopyScaled(it.in, buf + off, it.count, dtype, scaling.pre);
    off += it.bytes;
  }
  PhaseAll(jobs, items, "MEMCPY_IN_FUSION_BUFFER", false);
  PhaseAll(jobs, items, "MPI_ALLREDUCE", true);
  const int64_t count = static_cast<int64_t>(total / ElementSize(dtype));
  // Up to kPairwiseRanks ranks, pairwise in the buffer as a large tensor: faster than
  // MPI's allreduce of the buffer at 2 and 3 ranks, small buffers alike
  // (benchmarks/README.md, "The direct threshold by the set's size").
  if (comm_.size() > 1 && comm_.size() <= kPairwiseRanks) {
    co_await PairwiseAllreduce(*this, buf, buf, count, dtype, sig0.op, Scaling{});  // counts its call
  } else {
    ++stats_.mpi_calls;
    co_await comm_.AllreduceData(buf, buf, count, dtype, sig0.op);
  }
  PhaseAll(jobs, items, "MPI_ALLREDUCE", false);
  PhaseAll(jobs, items, "MEMCPY_OUT_FUSION_BUFFER", true);
  off = 0;
  for (const Item& it : items) {
    CopyScaled(buf + off, it.out, it.count, dtype, scaling.post);
    off += it.bytes;
  }
  PhaseAll(jobs, items, "MEMCPY_OUT_FUSION_BUFFER", false);
  // Requests sharing the buffer with another request count as fused.
  std::size_t first = items[0].job;
  bool shared = false;
  for (const Item& it : items) shared |= it.job != first;
  if (shared) {
    std::size_t last = SIZE_MAX;
    for (const Item& it : items) {
      if (it.job != last) ++stats_.fused_responses;
      last = it.job;
    }
  }
}

Task<> Operations::DirectAllreduce(Job& job, const Item& item) {
  Request& r = *job.request;
  Dequeue(job);
  timeline_.Begin(r.name, "MPI_ALLREDUCE");
  if (item.block) co_await BlockAllreduce(r, item);
  else co_await CollectiveOf(r.sig.kind).Execute(*this, r, item.tensor);
  timeline_.End(r.name, "MPI_ALLREDUCE");
}

Task<> Operations::BlockAllreduce(Request& r, const Item& item) {
  const DType dtype = r.sig.tensors[item.tensor].dtype;
  const Scaling scaling = ScalingFor(r, item.tensor);
  if (comm_.size() > 1 && comm_.size() <= kPairwiseRanks) {
    co_await PairwiseAllreduce(*this, item.in, item.out, item.count, dtype, r.sig.op, scaling);
    co_return;
  }
  // In place, chunk by chunk (as Allreduce::Execute), scaled while each chunk is in cache.
  const std::size_t esize = ElementSize(dtype);
  const int64_t step = comm_.ChunkCount(esize);
  ++stats_.mpi_calls;
  for (int64_t off = 0; off < item.count; off += step) {
    const int n = static_cast<int>(std::min(step, item.count - off));
    char* chunk = static_cast<char*>(item.out) + off * esize;
    if (scaling.pre != 1.0) Scale(chunk, chunk, n, dtype, scaling.pre);
    co_await comm_.AllreduceData(chunk, chunk, n, dtype, r.sig.op);
    if (scaling.post != 1.0) Scale(chunk, chunk, n, dtype, scaling.post);
  }
}

int64_t Operations::DirectThreshold() const {
  if (config_.direct_threshold > 0) return config_.direct_threshold;
  return comm_.size() <= kPairwiseRanks ? kPairwiseDirectBytes : kMpiDirectBytes;
}

Scaling Operations::ScalingFor(const Request& r, std::size_t t) const {
  return ScalingOf(r.sig.op, r.sig.prescale, r.sig.postscale, r.sig.tensors[t].dtype, AverageDivisor(r));
}

char* Operations::Output(Request& r, std::size_t t, std::size_t bytes, std::vector<int64_t> shape) {
  if (!r.store) {
    AdviseHugePages(r.outputs[t], bytes);
    return static_cast<char*>(r.outputs[t]);
  }
  auto& buffers = r.store->buffers;
  if (buffers.size() < r.sig.tensors.size()) buffers.resize(r.sig.tensors.size());
  buffers[t] = OutputStore::Allocate(bytes, std::move(shape));
  AdviseHugePages(buffers[t].data.get(), bytes);
  return buffers[t].data.get();
}

char* Operations::Scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

std::vector<int64_t> WithRows(const TensorSpec& spec, int64_t rows) {
  std::vector<int64_t> shape{rows};
  if (!spec.shape.empty()) shape.insert(shape.end(), spec.shape.begin() + 1, spec.shape.end());
  return shape;
}

}  // namespace jaxcache
