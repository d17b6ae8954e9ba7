// The XLA FFI targets of the point-to-point ops (CPU): jaxcache_send,
// jaxcache_recv, jaxcache_sendrecv (point_to_point_handlers.cc).
#pragma once

#include "xla/ffi/api/ffi.h"

namespace jaxcache {

XLA_FFI_DECLARE_HANDLER_SYMBOL(SendHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(RecvHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(SendrecvHandler);

}  // namespace jaxcache
