// XLA FFI entry points (typed FFI, asynchronous: each returns an
// xla::ffi::Future completed by the runtime's completion thread).
#pragma once

#include "xla/ffi/api/ffi.h"

namespace jaxcache {

XLA_FFI_DECLARE_HANDLER_SYMBOL(AllreduceHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BroadcastHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AllgatherHandler);

}  // namespace jaxcache
