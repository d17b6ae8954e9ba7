#include "operations.h"

#include <cstring>
#include <map>
#include <stdexcept>
#include <tuple>

#include "reduce_ops.h"

namespace jaxcache {

namespace {
// Small tensors that may share one fusion buffer: same dtype, op and scales.
using FusionKey = std::tuple<DType, ReduceOp, double, double>;

void CopyScaled(const void* in, void* out, int64_t count, DType dtype, double factor) {
  if (factor == 1.0) {
    if (in != out) std::memcpy(out, in, count * ElementSize(dtype));
  } else {
    Scale(in, out, count, dtype, factor);
  }
}
}  // namespace

void Operations::Dequeue(Work& w) {
  if (!timeline_.enabled() || !w.queued) return;
  timeline_.End(w.request->name, "QUEUE");
  w.queued = false;
}

void Operations::PhaseAll(std::vector<Work>& work, const std::vector<Item>& items,
                          const char* phase, bool begin) {
  if (!timeline_.enabled()) return;
  std::size_t last = SIZE_MAX;
  for (const Item& it : items) {
    if (it.work == last) continue;
    last = it.work;
    const std::string& name = work[it.work].request->name;
    begin ? timeline_.Begin(name, phase) : timeline_.End(name, phase);
  }
}

void Operations::Execute(std::vector<Work>& work, const Complete& complete) {
  std::vector<int> remaining(work.size(), 0);
  std::vector<std::size_t> allreduces, others;
  for (std::size_t i = 0; i < work.size(); ++i)
    (work[i].sig().kind == Kind::kAllreduce ? allreduces : others).push_back(i);
  if (!allreduces.empty()) Allreduce(work, allreduces, &remaining, complete);
  // (Completed work has handed its request on: only `others` are touched below.)
  for (std::size_t i : others) {
    Work& w = work[i];
    Status st;
    Dequeue(w);
    try {
      w.sig().kind == Kind::kBroadcast ? Broadcast(w) : Allgather(w);
    } catch (const std::exception& e) {
      st = Status::Error(ErrorKind::kInternal, e.what());
    }
    ++stats_.responses_executed;
    complete(std::move(w.request), st);
  }
}

void Operations::Allreduce(std::vector<Work>& work, const std::vector<std::size_t>& which,
                           std::vector<int>* remaining, const Complete& complete) {
  // Plan: small tensors go to fusion buckets keyed by (dtype, op, scales) in
  // order of first appearance; large ones are reduced directly from the
  // input into the output, which costs no copy at all.
  std::vector<FusionKey> key_order;
  std::map<FusionKey, std::vector<Item>> buckets;
  std::vector<Item> direct;
  for (std::size_t wi : which) {
    const Signature& sig = work[wi].sig();
    for (std::size_t t = 0; t < sig.tensors.size(); ++t) {
      const TensorSpec& spec = sig.tensors[t];
      Item item{wi, t, spec.NumElements(), spec.NumBytes()};
      if (item.count == 0) continue;
      ++(*remaining)[wi];
      stats_.bytes_reduced += item.bytes;
      if (static_cast<int64_t>(item.bytes) >= config_.direct_threshold) {
        direct.push_back(item);
        continue;
      }
      FusionKey key{spec.dtype, sig.op, sig.prescale, sig.postscale};
      auto& bucket = buckets[key];
      if (bucket.empty()) key_order.push_back(key);
      bucket.push_back(item);
    }
  }
  auto finish_item = [&](std::size_t wi) {
    if (--(*remaining)[wi] == 0 && work[wi].request) {
      ++stats_.responses_executed;
      complete(std::move(work[wi].request), Status::Ok());
    }
  };
  // Zero-size responses are complete already.
  for (std::size_t wi : which)
    if ((*remaining)[wi] == 0) {
      Dequeue(work[wi]);
      ++stats_.responses_executed;
      complete(std::move(work[wi].request), Status::Ok());
    }

  for (const FusionKey& key : key_order) {
    const auto& items = buckets[key];
    // Split into chunks of at most fusion_threshold bytes (and, without group
    // fusion, never across responses).
    std::size_t begin = 0;
    while (begin < items.size()) {
      std::size_t end = begin, bytes = 0;
      while (end < items.size() &&
             (end == begin || (bytes + items[end].bytes <= static_cast<std::size_t>(config_.fusion_threshold) &&
                               (config_.group_fusion || items[end].work == items[begin].work)))) {
        bytes += items[end].bytes;
        ++end;
      }
      std::vector<Item> chunk(items.begin() + begin, items.begin() + end);
      try {
        FusedAllreduce(work, chunk);
      } catch (const std::exception& e) {
        for (const Item& it : chunk)
          if (work[it.work].request) complete(std::move(work[it.work].request),
                                              Status::Error(ErrorKind::kInternal, e.what()));
        begin = end;
        continue;
      }
      for (const Item& it : chunk) finish_item(it.work);
      begin = end;
    }
  }
  for (const Item& item : direct) {
    Work& w = work[item.work];
    if (!w.request) continue;  // failed earlier
    try {
      DirectAllreduce(w, item);
    } catch (const std::exception& e) {
      complete(std::move(w.request), Status::Error(ErrorKind::kInternal, e.what()));
      continue;
    }
    finish_item(item.work);
  }
}

void Operations::FusedAllreduce(std::vector<Work>& work, const std::vector<Item>& items) {
  const Signature& sig0 = work[items[0].work].sig();
  DType dtype = sig0.tensors[items[0].tensor].dtype;
  std::size_t total = 0;
  for (const Item& it : items) total += it.bytes;
  if (items.size() == 1) {  // nothing to fuse: reduce in place, no copies
    DirectAllreduce(work[items[0].work], items[0]);
    return;
  }
  for (const Item& it : items) Dequeue(work[it.work]);
  if (fusion_buffer_.size() < total) fusion_buffer_.resize(total);
  char* buf = fusion_buffer_.data();
  PhaseAll(work, items, "MEMCPY_IN_FUSION_BUFFER", true);
  std::size_t off = 0;
  for (const Item& it : items) {
    const Request& r = *work[it.work].request;
    CopyScaled(r.inputs[it.tensor], buf + off, it.count, dtype, sig0.prescale);
    off += it.bytes;
  }
  PhaseAll(work, items, "MEMCPY_IN_FUSION_BUFFER", false);
  PhaseAll(work, items, "MPI_ALLREDUCE", true);
  comm_.AllreduceData(buf, buf, static_cast<int64_t>(total / ElementSize(dtype)), dtype, sig0.op);
  ++stats_.mpi_calls;
  PhaseAll(work, items, "MPI_ALLREDUCE", false);
  PhaseAll(work, items, "MEMCPY_OUT_FUSION_BUFFER", true);
  off = 0;
  for (const Item& it : items) {
    Request& r = *work[it.work].request;
    CopyScaled(buf + off, r.outputs[it.tensor], it.count, dtype, sig0.postscale);
    off += it.bytes;
  }
  PhaseAll(work, items, "MEMCPY_OUT_FUSION_BUFFER", false);
  // Responses sharing the buffer with another response count as fused.
  std::size_t first = items[0].work;
  bool shared = false;
  for (const Item& it : items) shared |= it.work != first;
  if (shared) {
    std::size_t last = SIZE_MAX;
    for (const Item& it : items) {
      if (it.work != last) ++stats_.fused_responses;
      last = it.work;
    }
  }
}

void Operations::DirectAllreduce(Work& w, const Item& item) {
  Request& r = *w.request;
  const Signature& sig = w.sig();
  DType dtype = sig.tensors[item.tensor].dtype;
  void* out = r.outputs[item.tensor];
  Dequeue(w);
  timeline_.Begin(r.name, "MPI_ALLREDUCE");
  // In-place MPI is markedly faster than separate buffers (MPICH copies the
  // send buffer itself), and the copy into the output absorbs the prescale.
  CopyScaled(r.inputs[item.tensor], out, item.count, dtype, sig.prescale);
  comm_.AllreduceData(out, out, item.count, dtype, sig.op);
  ++stats_.mpi_calls;
  if (sig.postscale != 1.0) Scale(out, out, item.count, dtype, sig.postscale);
  timeline_.End(r.name, "MPI_ALLREDUCE");
}

void Operations::Broadcast(Work& w) {
  Request& r = *w.request;
  const Signature& sig = w.sig();
  timeline_.Begin(r.name, "MPI_BCAST");
  for (std::size_t t = 0; t < sig.tensors.size(); ++t) {
    std::size_t bytes = sig.tensors[t].NumBytes();
    if (bytes == 0) continue;
    if (comm_.rank() == sig.root && r.inputs[t] != r.outputs[t])
      std::memcpy(r.outputs[t], r.inputs[t], bytes);
    comm_.BroadcastData(r.outputs[t], static_cast<int64_t>(bytes), sig.root);
    ++stats_.mpi_calls;
  }
  timeline_.End(r.name, "MPI_BCAST");
}

void Operations::Allgather(Work& w) {
  Request& r = *w.request;
  const Signature& sig = w.sig();
  timeline_.Begin(r.name, "MPI_ALLGATHER");
  for (std::size_t t = 0; t < sig.tensors.size(); ++t) {
    std::size_t bytes = sig.tensors[t].NumBytes();
    if (bytes == 0) continue;
    comm_.AllgatherData(r.inputs[t], r.outputs[t], static_cast<int64_t>(bytes));
    ++stats_.mpi_calls;
  }
  timeline_.End(r.name, "MPI_ALLGATHER");
}

}  // namespace jaxcache
