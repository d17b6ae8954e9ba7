// XLA FFI entry points (typed FFI). Every target has two stages:
//  - instantiate, once per custom-call instruction of a compiled program:
//    gives the instance its final collective name (see CallSite);
//  - execute, asynchronous: submits the request and returns an
//    xla::ffi::Future completed by the runtime's completion thread.
#pragma once

#include "xla/ffi/api/ffi.h"

namespace jaxcache {

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

XLA_FFI_DECLARE_HANDLER_SYMBOL(AllreduceInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AllreduceHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BroadcastInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BroadcastHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AllgatherInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AllgatherHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ReducescatterInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ReducescatterHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AlltoallInstantiate);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AlltoallHandler);
// Synchronous: this process's rank, read when the program runs.
XLA_FFI_DECLARE_HANDLER_SYMBOL(RankHandler);

}  // namespace jaxcache
