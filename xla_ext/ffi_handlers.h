// XLA FFI entry points (typed FFI). Every target has two stages:
//  - instantiate, once per custom-call instruction of a compiled program:
//    gives the instance its final collective name (see CallSite);
//  - execute: builds the request and hands it to the runtime. On CPU the
//    execute stage is asynchronous: it returns an xla::ffi::Future completed
//    by the runtime's completion thread. The CUDA handlers
//    (cuda_handlers.h) share the instantiate stage and the request building.
#pragma once

#include <memory>
#include <string>

#include "common.h"
#include "request.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcache {

class Runtime;

// Per-instruction state. JAX lowers a function called several times inside
// one program once and calls it from each site, so two instructions can carry
// the same name; instances of one (program, name) are told apart by the
// order in which XLA instantiates them, which is the same on every rank.
struct CallSite {
  static xla::ffi::TypeId id;
  std::string name;
};
// For jax.ffi.register_ffi_type.
void* CallSiteTypeId();
void* CallSiteTypeInfo();

// What one custom call of a collective asks for, from its attributes.
struct CollectiveCall {
  Kind kind = Kind::kAllreduce;
  int64_t world_size = 0;  // the size the program was traced for
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = 0;
};

// One execution checked against the running runtime: its request over XLA's
// buffers (host or device addresses, as `device` says; the caller decides
// what the runtime gets to touch), or, when `request` is null, why not.
struct PreparedRequest {
  std::shared_ptr<Runtime> runtime;
  RequestPtr request;
  Status status;
};
PreparedRequest PrepareRequest(const CollectiveCall& call, const CallSite& site, Device device,
                               xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets);

// The XLA error for a failed request: the message starts with the name of the
// Python exception class it maps to (jaxcache/errors.py).
xla::ffi::Error ToFfiError(const Status& status, xla::ffi::ErrorCode code);

// This process's rank, or an error when the runtime is not running.
xla::ffi::ErrorOr<int32_t> RunningRank();

// Every attribute is bound at both stages and on every platform (XLA checks
// the count); the instantiate handlers below serve every platform.
#define JAXCACHE_FFI_COMMON_ATTRS \
  .Attr<std::string_view>("name").Attr<int64_t>("program").Attr<int64_t>("world_size")
#define JAXCACHE_FFI_REDUCE_ATTRS \
  JAXCACHE_FFI_COMMON_ATTRS.Attr<int64_t>("op").Attr<double>("prescale").Attr<double>("postscale")
#define JAXCACHE_FFI_BROADCAST_ATTRS JAXCACHE_FFI_COMMON_ATTRS.Attr<int64_t>("root")

XLA_FFI_DECLARE_HANDLER_SYMBOL(AllreduceInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AllreduceHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BroadcastInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BroadcastHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AllgatherInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AllgatherHandler);
// Synchronous: this process's rank, read when the program runs.
XLA_FFI_DECLARE_HANDLER_SYMBOL(RankHandler);

}  // namespace jaxcache
