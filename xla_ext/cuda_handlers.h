// XLA FFI handlers for CUDA (tier A: host-staged). Built only with
// JAXCACHE_CUDA; the instantiate stage and the request building are the CPU
// targets' (ffi_handlers.h), with a state type of CUDA's own.
//
// Each call copies its operands device-to-host on XLA's stream into pinned
// staging memory, waits for that copy, hands a host request to the same
// runtime as the CPU path (negotiation, cache, fusion and MPI unchanged),
// waits for its completion, and enqueues the host-to-device copies of the
// results on XLA's stream before returning. The handlers are synchronous:
// XLA:GPU would block its thread on a returned future anyway, and device
// work must be on the stream before the handler returns. They are not
// command-buffer (CUDA graph) compatible: they do host work on every call.
#pragma once

#include <cstddef>
#include <string>

#include "ffi_handlers.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcache {

// Registered with the CUDA plugin's type registry (see CpuCallSite).
struct CudaCallSite : CallSite {
  static xla::ffi::TypeId id;
};
void* CudaCallSiteTypeId();
void* CudaCallSiteTypeInfo();

// <Kind>CudaInstantiate and <Kind>CudaHandler for every kind with an XLA target.
#define JAXCACHE_DECLARE_CUDA_TARGET(E, name, target)                         \
  JAXCACHE_IF_XLA(target, XLA_FFI_DECLARE_HANDLER_SYMBOL(E##CudaInstantiate); \
                  XLA_FFI_DECLARE_HANDLER_SYMBOL(E##CudaHandler);)
JAXCACHE_KINDS(JAXCACHE_DECLARE_CUDA_TARGET)
#undef JAXCACHE_DECLARE_CUDA_TARGET
XLA_FFI_DECLARE_HANDLER_SYMBOL(RankCudaHandler);

// CUDA devices this process can use; -1 (and `error`) when CUDA cannot start
// here, e.g. cudaErrorInsufficientDriver on a machine without a driver.
int CudaDeviceCount(std::string* error);
// Version of the CUDA runtime linked in (e.g. 13000).
int CudaRuntimeVersion();
// Pinned staging memory currently held by the pool, in bytes.
std::size_t CudaStagingBytes();

}  // namespace jaxcache
