#include "operations.h"

#include <algorithm>
#include <cstring>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <map>
#include <stdexcept>
#include <tuple>

#include "reduce_ops.h"

namespace jaxcache {

namespace {
// Small tensors that may share one fusion buffer: same dtype, op and scales.
using FusionKey = std::tuple<DType, ReduceOp, double, double>;

// Tensors already in their result buffer are reduced directly from this size,
// not through the fusion buffer (measured: benchmarks/README.md, "The runtime's
// constants").
constexpr int64_t kInPlaceDirectBytes = 512 << 10;

// Reducescatters run as pairwise exchanges (PairwiseReducescatter) on up to
// this many ranks at any size, and on more from this many bytes (MPICH's own
// crossover to pairwise exchange); faster than MPI_Ireduce_scatter_block at
// every size measured (benchmarks/README.md, "The runtime's constants").
constexpr int kPairwiseReducescatterRanks = 4;
constexpr int64_t kPairwiseReducescatterBytes = 512 << 10;

// The timeline phase of a kind's MPI work; null when it needs none.
const char* MpiPhase(Kind kind) {
  switch (kind) {
    case Kind::kBroadcast: return "MPI_BCAST";
    case Kind::kAllgather: return "MPI_ALLGATHER";
    case Kind::kReducescatter: return "MPI_REDUCESCATTER";
    case Kind::kAlltoall: return "MPI_ALLTOALL";
    case Kind::kAllreduce: return "MPI_ALLREDUCE";
    // The negotiation was the synchronization.
    case Kind::kBarrier: case Kind::kJoin: return nullptr;
  }
  return nullptr;
}

// Result buffers fresh from XLA's allocator are first touched by the copy into
// them or by MPI. Faulted in 4 KiB pages they cost more than the collective
// itself (measured, 100 MB alltoall on 2 ranks: 79 ms into an XLA buffer, 20 ms
// into a fresh NumPy one). NumPy asks for transparent huge pages for large
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
}  // namespace

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
  ++stats_.responses_executed;
  complete_(t.request, t.status);
}

Task<std::string> Operations::Execute(const std::vector<Request*>& work, Complete complete) {
  complete_ = std::move(complete);
  first_failure_.clear();
  std::vector<Job> jobs;
  jobs.reserve(work.size());
  for (Request* r : work) jobs.push_back({r});
  std::vector<std::size_t> allreduces, others;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    (jobs[i].request->sig.kind == Kind::kAllreduce ? allreduces : others).push_back(i);
  if (!allreduces.empty()) co_await Allreduce(jobs, allreduces);
  for (std::size_t i : others) {
    Job& t = jobs[i];
    const Signature& sig = t.request->sig;
    Dequeue(t);
    // A barrier's or a join's negotiation was the synchronization: no MPI call.
    if (const char* phase = MpiPhase(sig.kind)) {
      timeline_.Begin(t.request->name, phase);
      for (std::size_t k = 0; k < sig.tensors.size(); ++k)
        co_await Step(jobs, std::vector<std::size_t>(1, i), [&, k]() -> Task<> {
          switch (sig.kind) {
            case Kind::kBroadcast: return BroadcastTensor(t, k);
            case Kind::kAllgather: return AllgatherTensor(t, k);
            case Kind::kReducescatter: return ReducescatterTensor(t, k);
            case Kind::kAlltoall: return AlltoallTensor(t, k);
            // Allreduces ran above; barriers and joins have no MPI phase.
            case Kind::kAllreduce: case Kind::kBarrier: case Kind::kJoin: break;
          }
          throw std::logic_error(std::string("jaxcache: no MPI step for a ") + KindName(sig.kind));
        });
      timeline_.End(t.request->name, phase);
    }
    t.remaining = 1;
    Done(t);
  }
  complete_ = nullptr;
  co_return first_failure_;
}

Task<> Operations::Allreduce(std::vector<Job>& jobs, const std::vector<std::size_t>& which) {
  // Plan: small tensors go to fusion buckets keyed by (dtype, op, scales) in
  // order of first appearance; large ones are reduced directly from the
  // input into the output, which costs no copy at all.
  std::vector<FusionKey> key_order;
  std::map<FusionKey, std::vector<Item>> buckets;
  std::vector<Item> direct;
  for (std::size_t ti : which) {
    const Signature& sig = jobs[ti].request->sig;
    for (std::size_t t = 0; t < sig.tensors.size(); ++t) {
      const TensorSpec& spec = sig.tensors[t];
      Item item{ti, t, spec.NumElements(), spec.NumBytes()};
      if (item.count == 0) continue;
      stats_.bytes_reduced += item.bytes;
      // A tensor reduced in its own buffer (XLA aliased a donated operand with
      // its result) goes direct from a lower size: fusing it would add two copies.
      const Request& req = *jobs[ti].request;
      const bool in_place = req.inputs[t] == req.outputs[t];
      const int64_t threshold =
          in_place ? std::min<int64_t>(config_.direct_threshold, kInPlaceDirectBytes) : config_.direct_threshold;
      if (static_cast<int64_t>(item.bytes) >= threshold) {
        ++jobs[ti].remaining;
        direct.push_back(item);
        continue;
      }
      FusionKey key{spec.dtype, sig.op, Prescale(*jobs[ti].request), sig.postscale};
      auto& bucket = buckets[key];
      if (bucket.empty()) key_order.push_back(key);
      bucket.push_back(item);
    }
  }
  // Split each bucket into chunks of at most fusion_threshold bytes (and,
  // without group fusion, never across requests); count each task's chunks.
  // A chunk also stays within the MPI chunk size: copied in, reduced and copied
  // out while it is still in cache.
  std::size_t chunk_cap = static_cast<std::size_t>(config_.fusion_threshold);
  if (config_.chunk_bytes > 0) chunk_cap = std::min(chunk_cap, static_cast<std::size_t>(config_.chunk_bytes));
  std::vector<std::vector<Item>> chunks;
  for (const FusionKey& key : key_order) {
    const auto& items = buckets[key];
    std::size_t begin = 0;
    while (begin < items.size()) {
      std::size_t end = begin, bytes = 0;
      while (end < items.size() &&
             (end == begin || (bytes + items[end].bytes <= chunk_cap &&
                               (config_.group_fusion || items[end].job == items[begin].job)))) {
        bytes += items[end].bytes;
        ++end;
      }
      chunks.emplace_back(items.begin() + begin, items.begin() + end);
      std::size_t last = SIZE_MAX;
      for (const Item& it : chunks.back()) {
        if (it.job != last) ++jobs[it.job].remaining;
        last = it.job;
      }
      begin = end;
    }
  }
  // Zero-size requests are complete already.
  for (std::size_t ti : which)
    if (jobs[ti].remaining == 0) {
      jobs[ti].remaining = 1;
      Done(jobs[ti]);
    }
  for (const auto& chunk : chunks) {
    std::vector<std::size_t> touched;
    for (const Item& it : chunk)
      if (touched.empty() || touched.back() != it.job) touched.push_back(it.job);
    co_await Step(jobs, touched, [&]() { return FusedAllreduce(jobs, chunk); });
    for (std::size_t ti : touched) Done(jobs[ti]);
  }
  for (const Item& item : direct) {
    co_await Step(jobs, std::vector<std::size_t>(1, item.job), [&]() { return DirectAllreduce(jobs[item.job], item); });
    Done(jobs[item.job]);
  }
}

Task<> Operations::FusedAllreduce(std::vector<Job>& jobs, const std::vector<Item>& items) {
  if (items.size() == 1) {  // nothing to fuse: reduce in place, no copies
    co_await DirectAllreduce(jobs[items[0].job], items[0]);
    co_return;
  }
  const Request& r0 = *jobs[items[0].job].request;
  const Signature& sig0 = r0.sig;
  const double prescale = Prescale(r0);  // the same for every item (the fusion key)
  DType dtype = sig0.tensors[items[0].tensor].dtype;
  std::size_t total = 0;
  for (const Item& it : items) total += it.bytes;
  for (const Item& it : items) Dequeue(jobs[it.job]);
  if (fusion_buffer_.size() < total) fusion_buffer_.resize(total);
  char* buf = fusion_buffer_.data();
  PhaseAll(jobs, items, "MEMCPY_IN_FUSION_BUFFER", true);
  std::size_t off = 0;
  for (const Item& it : items) {
    const Request& r = *jobs[it.job].request;
    CopyScaled(r.inputs[it.tensor], buf + off, it.count, dtype, prescale);
    off += it.bytes;
  }
  PhaseAll(jobs, items, "MEMCPY_IN_FUSION_BUFFER", false);
  PhaseAll(jobs, items, "MPI_ALLREDUCE", true);
  ++stats_.mpi_calls;
  co_await comm_.AllreduceData(buf, buf, static_cast<int64_t>(total / ElementSize(dtype)), dtype, sig0.op);
  PhaseAll(jobs, items, "MPI_ALLREDUCE", false);
  PhaseAll(jobs, items, "MEMCPY_OUT_FUSION_BUFFER", true);
  off = 0;
  for (const Item& it : items) {
    Request& r = *jobs[it.job].request;
    CopyScaled(buf + off, r.outputs[it.tensor], it.count, dtype, sig0.postscale);
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
  const Signature& sig = r.sig;
  DType dtype = sig.tensors[item.tensor].dtype;
  void* out = r.outputs[item.tensor];
  Dequeue(job);
  timeline_.Begin(r.name, "MPI_ALLREDUCE");
  // In-place MPI is markedly faster than separate buffers (MPICH copies the
  // send buffer itself), and the copy into the output absorbs the prescale.
  // Chunk by chunk: each is copied, reduced and postscaled while in cache.
  const void* in = r.inputs[item.tensor];
  if (in != out) AdviseHugePages(out, item.bytes);
  const std::size_t esize = ElementSize(dtype);
  const int64_t step = comm_.ChunkCount(esize);
  const double prescale = Prescale(r);
  ++stats_.mpi_calls;
  for (int64_t off = 0; off < item.count; off += step) {
    const int64_t n = std::min(step, item.count - off);
    char* o = static_cast<char*>(out) + off * esize;
    CopyScaled(static_cast<const char*>(in) + off * esize, o, n, dtype, prescale);
    co_await comm_.AllreduceData(o, o, n, dtype, sig.op);
    if (sig.postscale != 1.0) Scale(o, o, n, dtype, sig.postscale);
  }
  timeline_.End(r.name, "MPI_ALLREDUCE");
}

Task<> Operations::BroadcastTensor(Job& job, std::size_t t) {
  Request& r = *job.request;
  const Signature& sig = r.sig;
  std::size_t bytes = sig.tensors[t].NumBytes();
  if (bytes == 0) co_return;
  if (comm_.rank() == sig.root && r.inputs[t] != r.outputs[t])
    std::memcpy(r.outputs[t], r.inputs[t], bytes);
  ++stats_.mpi_calls;
  co_await comm_.BroadcastData(r.outputs[t], static_cast<int64_t>(bytes), sig.root);
}

double Operations::Prescale(const Request& r) const {
  return r.sig.op == ReduceOp::kAverage ? r.sig.prescale / Contributors(r) : r.sig.prescale;
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

namespace {
// `rows` rows of a tensor shaped like `spec` (a scalar's rows form a vector).
std::vector<int64_t> WithRows(const TensorSpec& spec, int64_t rows) {
  std::vector<int64_t> shape{rows};
  if (!spec.shape.empty()) shape.insert(shape.end(), spec.shape.begin() + 1, spec.shape.end());
  return shape;
}
}  // namespace

Task<> Operations::AllgatherTensor(Job& job, std::size_t t) {
  Request& r = *job.request;
  const TensorSpec& spec = r.sig.tensors[t];
  const int size = comm_.size();
  const int64_t row = static_cast<int64_t>(spec.RowBytes());
  // Bytes from each rank: as agreed (joined ranks: none), else equal shapes.
  std::vector<int64_t> rows(size, spec.Rows());
  const Agreement* agreed = r.agreement.get();
  if (agreed && agreed->rows.size() >= (t + 1) * size)
    for (int q = 0; q < size; ++q) rows[q] = agreed->rows[t * size + q];
  std::vector<int64_t> bytes(size);
  int64_t total = 0, total_rows = 0;
  bool equal = true;
  for (int q = 0; q < size; ++q) {
    bytes[q] = rows[q] * row;
    total += bytes[q];
    total_rows += rows[q];
    equal &= rows[q] == rows[0];
  }
  char* out = Output(r, t, total, WithRows(spec, total_rows));
  if (r.store && agreed) r.store->rows = agreed->rows;
  if (r.store) r.store->contributors = Contributors(r);
  if (total == 0) co_return;
  ++stats_.mpi_calls;
  if (equal) co_await comm_.AllgatherData(r.inputs[t], out, bytes[0]);
  else co_await comm_.AllgathervData(r.inputs[t], out, bytes);
}

Task<> Operations::ReducescatterTensor(Job& job, std::size_t t) {
  Request& r = *job.request;
  const Signature& sig = r.sig;
  const TensorSpec& spec = sig.tensors[t];
  const int size = comm_.size();
  const int64_t row = static_cast<int64_t>(spec.RowBytes() / ElementSize(spec.dtype));
  std::vector<int64_t> counts(size);
  for (int q = 0; q < size; ++q) counts[q] = ScatterRows(spec.Rows(), size, q) * row;
  const int64_t count = spec.NumElements();
  if (count == 0) co_return;
  stats_.bytes_reduced += spec.NumBytes();
  void* out = r.outputs[t];
  const std::size_t esize = ElementSize(spec.dtype);
  AdviseHugePages(out, counts[comm_.rank()] * esize);
  const double post = sig.op == ReduceOp::kAverage ? sig.postscale / Contributors(r) : sig.postscale;
  if (size > 1 && (size <= kPairwiseReducescatterRanks ||
                   static_cast<int64_t>(spec.NumBytes()) >= kPairwiseReducescatterBytes)) {
    co_await PairwiseReducescatter(r.inputs[t], out, counts, spec.dtype, sig.op, sig.prescale, post);
    co_return;
  }
  // The input is not copied unless a prescale asks for it; an average's
  // division is applied to the (smaller) result instead.
  const void* in = r.inputs[t];
  if (sig.prescale != 1.0) {
    if (scratch_.size() < spec.NumBytes()) scratch_.resize(spec.NumBytes());
    Scale(in, scratch_.data(), count, spec.dtype, sig.prescale);
    in = scratch_.data();
  }
  ++stats_.mpi_calls;
  co_await comm_.ReducescatterData(in, out, counts, spec.dtype, sig.op);
  if (post != 1.0) Scale(out, out, counts[comm_.rank()], spec.dtype, post);
}

Task<> Operations::PairwiseReducescatter(const void* in, void* out, const std::vector<int64_t>& counts,
                                         DType dtype, ReduceOp op, double prescale, double postscale) {
  const int size = comm_.size(), me = comm_.rank();
  const std::size_t esize = ElementSize(dtype);
  // Pieces of JAXCACHE_CHUNK_BYTES: 1 and 16 MiB pieces were slower than 4 MiB
  // at 16-100 MB (2 ranks), one piece per block 1.2x slower at 100 MB.
  const int64_t longest = *std::max_element(counts.begin(), counts.end());
  const int64_t per = std::max<int64_t>(1, std::min(comm_.ChunkCount(esize), longest));
  const bool scaled = prescale != 1.0;
  if (size > 2 || scaled) {
    const std::size_t need = static_cast<std::size_t>(per) * esize * (scaled ? 2 : 1);
    if (scratch_.size() < need) scratch_.resize(need);
  }
  std::vector<int64_t> displ(size, 0);
  for (int q = 1; q < size; ++q) displ[q] = displ[q - 1] + counts[q - 1];
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  op = Reduction(op);
  ++stats_.mpi_calls;  // counted per tensor, as the other chunked calls are
  // Piece by piece so that what arrives is reduced while it is in cache. Every
  // rank runs the same pieces and steps in the same order; step k sends to
  // rank me + k the piece of its block and receives from rank me - k the piece
  // of ours.
  for (int64_t off = 0; off < longest; off += per) {
    const int64_t n = std::clamp<int64_t>(counts[me] - off, 0, per);
    char* acc = dst + off * esize;
    for (int k = 1; k < size; ++k) {
      const int to = (me + k) % size, from = (me - k + size) % size;
      const int64_t sn = std::clamp<int64_t>(counts[to] - off, 0, per);
      char* landing = k == 1 ? acc : scratch_.data();
      co_await comm_.Exchange(src + (displ[to] + off) * esize, sn, to, landing, n, from, dtype,
                              "a reducescatter");
      if (scaled) Scale(landing, landing, n, dtype, prescale);
      if (k > 1) ReduceLocal(dtype, op, landing, acc, n);
    }
    const char* own = src + (displ[me] + off) * esize;
    if (scaled) {
      char* own_scaled = scratch_.data() + per * esize;
      Scale(own, own_scaled, n, dtype, prescale);
      ReduceLocal(dtype, op, own_scaled, acc, n);
    } else {
      ReduceLocal(dtype, op, own, acc, n);
    }
    if (postscale != 1.0) Scale(acc, acc, n, dtype, postscale);  // while the piece is in cache
  }
}

Task<> Operations::AlltoallTensor(Job& job, std::size_t t) {
  Request& r = *job.request;
  const TensorSpec& spec = r.sig.tensors[t];
  const int size = comm_.size(), me = comm_.rank();
  const int64_t row = static_cast<int64_t>(spec.RowBytes());
  // rows[s * size + d]: rows rank s sends to rank d (rank 0 checked them).
  std::vector<int64_t> rows(static_cast<std::size_t>(size) * size, spec.Rows() / size);
  if (r.agreement && r.agreement->rows.size() == rows.size()) rows = r.agreement->rows;
  std::vector<int64_t> send(size), recv(size), received(size);
  int64_t total = 0, largest = 0;
  for (int q = 0; q < size; ++q) {
    send[q] = rows[static_cast<std::size_t>(me) * size + q] * row;
    received[q] = rows[static_cast<std::size_t>(q) * size + me];
    recv[q] = received[q] * row;
    total += received[q];
  }
  for (int64_t n : rows) largest = std::max(largest, n * row);
  char* out = Output(r, t, total * row, WithRows(spec, total));
  if (r.store) r.store->rows = received;
  if (largest == 0) co_return;
  ++stats_.mpi_calls;
  co_await comm_.AlltoallData(r.inputs[t], send, out, recv, largest);
}

}  // namespace jaxcache
