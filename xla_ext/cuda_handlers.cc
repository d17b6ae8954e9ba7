#include "cuda_handlers.h"

#include <cuda_runtime.h>

#include <condition_variable>
#include <mutex>
#include <vector>

#include "collectives/collective.h"
#include "cuda_staging.h"
#include "ffi_handlers.h"
#include "runtime.h"

namespace ffi = xla::ffi;

namespace jaxcache {

ffi::TypeId CudaCallSite::id = {};

namespace {

XLA_FFI_TypeInfo cuda_call_site_type_info = ffi::MakeTypeInfo<CudaCallSite>();

// Staging offsets are aligned like device allocations, so that the DMA
// engines and the runtime's vectorised copies see aligned host memory.
constexpr std::size_t kAlign = 256;
std::size_t Aligned(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Where one tensor's operand and result live in the staging block.
struct Region {
  std::size_t in_offset, in_bytes, out_offset, out_bytes;
};

// The calling thread sleeps until the runtime completes the request.
class Waiter {
 public:
  void Finish(const Status& st) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = st;
    done_ = true;
    cv_.notify_all();
  }
  Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

ffi::Error CudaFailure(const std::string& name, const std::string& what) {
  return ToFfiError(Status::Error(ErrorKind::kInternal,
                                  "jaxcache: CUDA staging of '" + name + "' failed: " + what),
                    ffi::ErrorCode::kInternal);
}

// Where each tensor's operand and result go in one staging block: reductions
// and broadcasts work in place, so one region serves as operand and result;
// any other collective gets a separate result region. Returns the block's size.
std::size_t Layout(const Submission& s, bool in_place, std::vector<Region>& regions) {
  regions.resize(s.inputs.size());
  std::size_t total = 0;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    Region& r = regions[i];
    r.in_bytes = s.sig.tensors[i].NumBytes();
    r.out_bytes = s.output_bytes[i];
    r.in_offset = total;
    total += Aligned(r.in_bytes);
    if (in_place) {
      r.out_offset = r.in_offset;
    } else {
      r.out_offset = total;
      total += Aligned(r.out_bytes);
    }
  }
  return total;
}

// Copies the operands into `staging` and points the submission at host memory;
// returns the device result addresses, or sets `error`.
std::vector<void*> StageIn(cudaStream_t stream, Submission& s, const std::vector<Region>& regions,
                           StagingLease& staging, std::string* error) {
  char* host = staging.data();
  cudaError_t err;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].in_bytes == 0) continue;
    err = cudaMemcpyAsync(host + regions[i].in_offset, s.inputs[i], regions[i].in_bytes,
                          cudaMemcpyDeviceToHost, stream);
    if (err != cudaSuccess) return *error = CudaErrorText("cudaMemcpyAsync", err), std::vector<void*>{};
  }
  // Waits for the operands (and whatever produced them on XLA's stream).
  if ((err = cudaEventRecord(staging.event(), stream)) != cudaSuccess ||
      (err = cudaEventSynchronize(staging.event())) != cudaSuccess)
    return *error = CudaErrorText("waiting for the device-to-host copy", err), std::vector<void*>{};
  std::vector<void*> device_outputs = s.outputs;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    s.inputs[i] = host + regions[i].in_offset;
    s.outputs[i] = host + regions[i].out_offset;
  }
  return device_outputs;
}

// Enqueues the results' host-to-device copies on XLA's stream.
bool StageOut(cudaStream_t stream, const std::vector<void*>& device_outputs, const std::vector<Region>& regions,
              StagingLease& staging, std::string* error) {
  for (std::size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].out_bytes == 0) continue;
    cudaError_t err = cudaMemcpyAsync(device_outputs[i], staging.data() + regions[i].out_offset,
                                      regions[i].out_bytes, cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess) return *error = CudaErrorText("cudaMemcpyAsync", err), false;
  }
  // The block stays out of the pool until these copies have run.
  return staging.Release(error);
}

ffi::Error RunStaged(cudaStream_t stream, const CallSite& site, int64_t run, int32_t ordinal,
                     ffi::RemainingArgs args, ffi::RemainingRets rets) {
  DescribedCall described = Describe(site.call, site, Device::kCuda, args, rets);
  // A device of a program over several takes part even when it cannot: the
  // other devices' parts would wait for it.
  if (!described.status.ok() && site.devices.empty())
    return ToFfiError(described.status, ffi::ErrorCode::kFailedPrecondition);
  Submission& s = described.submission;
  const std::string name = s.name;
  std::vector<Region> regions;
  std::vector<void*> device_outputs;
  StagingLease staging;
  std::string error;
  if (described.status.ok()) {
    const std::size_t total = Layout(s, CollectiveOf(site.call.kind).InPlace(), regions);
    if (staging.Acquire(total, stream, &error)) device_outputs = StageIn(stream, s, regions, staging, &error);
    if (!error.empty()) {
      if (site.devices.empty()) return CudaFailure(name, error);
      described.status = Status::Error(ErrorKind::kInternal, "jaxcache: CUDA staging of '" + name + "' failed: " + error);
    }
  }
  Waiter waiter;
  // Cheap: it only wakes this thread, so the runtime may run it directly.
  Dispatch(site, run, ordinal, std::move(described),
           Completion([&waiter](const Status& st) { waiter.Finish(st); }, /*cheap=*/true));
  Status status = waiter.Wait();
  if (!status.ok()) return ToFfiError(status, ffi::ErrorCode::kAborted);
  if (!StageOut(stream, device_outputs, regions, staging, &error)) return CudaFailure(name, error);
  return ffi::Error::Success();
}

// As on the CPU (ffi_handlers.cc): the execute stage of every kind's target.
ffi::Error CollectiveImpl(cudaStream_t stream, CudaCallSite* site, ffi::RunId run, int32_t ordinal,
                          ffi::RemainingArgs args, ffi::RemainingRets rets) {
  return RunStaged(stream, *site, run.run_id, ordinal, args, rets);
}

ffi::Error RankImpl(cudaStream_t stream, ffi::Result<ffi::Buffer<ffi::S32>> out,
                    int64_t process_set) {
  auto rank = RunningRank(process_set);
  if (rank.has_error()) return rank.error();
  // A copy from pageable memory returns once the source has been read.
  int32_t value = rank.value();
  cudaError_t err = cudaMemcpyAsync(out->typed_data(), &value, sizeof value,
                                    cudaMemcpyHostToDevice, stream);
  if (err != cudaSuccess) return CudaFailure("jaxcache_rank", CudaErrorText("cudaMemcpyAsync", err));
  return ffi::Error::Success();
}

}  // namespace

int CudaDeviceCount(std::string* error) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    *error = CudaErrorText("cudaGetDeviceCount", err);
    return -1;
  }
  return n;
}

int CudaRuntimeVersion() {
  int v = 0;
  cudaRuntimeGetVersion(&v);
  return v;
}

std::size_t CudaStagingBytes() { return StagingPool::Get().held_bytes(); }

void* CudaCallSiteTypeId() { return &CudaCallSite::id; }
void* CudaCallSiteTypeInfo() { return &cuda_call_site_type_info; }

#define JAXCACHE_CUDA_BIND \
  ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::State<CudaCallSite>>() \
      .Ctx<ffi::RunId>().Ctx<ffi::DeviceOrdinal>().RemainingArgs().RemainingRets()

#define JAXCACHE_DEFINE_CUDA_TARGET(E, name, target)                                             \
  JAXCACHE_IF_XLA(target,                                                                        \
                  XLA_FFI_DEFINE_HANDLER_SYMBOL(E##CudaInstantiate, (Instantiate<CudaCallSite, Kind::k##E>), \
                                                ffi::Ffi::BindInstantiate() JAXCACHE_FFI_ATTRS);  \
                  XLA_FFI_DEFINE_HANDLER_SYMBOL(E##CudaHandler, CollectiveImpl, JAXCACHE_CUDA_BIND);)
JAXCACHE_KINDS(JAXCACHE_DEFINE_CUDA_TARGET)
#undef JAXCACHE_DEFINE_CUDA_TARGET

XLA_FFI_DEFINE_HANDLER_SYMBOL(RankCudaHandler, RankImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("process_set"));

}  // namespace jaxcache
