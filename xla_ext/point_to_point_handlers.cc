// The XLA FFI targets of send, recv and sendrecv (CPU). Each takes and
// returns the token of its ordered effects (jaxcache/ops/point_to_point.py),
// builds a P2POp over XLA's buffers and starts it; the returned future
// completes once the op has.
#include "point_to_point_handlers.h"

#include <climits>
#include <cstring>
#include <string>

#include "ffi_handlers.h"
#include "runtime.h"

namespace ffi = xla::ffi;

namespace jaxcache {

namespace {

Status Invalid(std::string message) { return Status::Error(ErrorKind::kInvalidArgument, std::move(message)); }

// What one custom call asks for. dest < 0: no sending side.
struct P2PCall {
  std::string_view name;
  int64_t process_set = 0;
  int64_t dest = -1, send_tag = 0;
  const ffi::AnyBuffer* send = nullptr;
  int64_t source = kAnySource, recv_tag = kAnyTag;
  ffi::AnyBuffer* recv = nullptr;
  int64_t status = 0;  // address of an MPI_Status to fill, or 0
};

Status DescribeBuffer(const ffi::AnyBuffer& buf, const std::string& name, DType* dtype,
                      std::vector<int64_t>* shape) {
  auto d = FromXla(buf.element_type());
  if (!d) return Invalid("jaxcache: unsupported dtype in '" + name + "'");
  auto dims = buf.dimensions();
  if (dims.size() > static_cast<std::size_t>(kP2PMaxDims))
    return Invalid("jaxcache: '" + name + "' has " + std::to_string(dims.size()) +
                   " dimensions; point-to-point messages have at most " + std::to_string(kP2PMaxDims));
  *dtype = *d;
  shape->assign(dims.begin(), dims.end());
  return Status::Ok();
}

// Builds the op, or says why not.
Status Build(const P2PCall& call, P2POp* op) {
  auto runtime = Runtime::Current();
  op->name = std::string(call.name);
  if (!runtime || !runtime->running())
    return Status::Error(ErrorKind::kShutdown, "jaxcache is not initialized (call jaxcache.init())");
  op->set = runtime->Set(static_cast<int32_t>(call.process_set));
  if (!op->set)
    return Invalid("jaxcache: '" + op->name + "' names process set " + std::to_string(call.process_set) +
                   ", which is not registered on this rank (removed, or this rank is not a member)");
  const int size = op->set->comm().size();
  const int tag_ub = op->set->p2p().tag_ub();
  op->rank = op->set->comm().rank();
  if (call.send) {
    if (call.dest < 0 || call.dest >= size)
      return Invalid("jaxcache: '" + op->name + "' sends to rank " + std::to_string(call.dest) +
                     ", outside 0.." + std::to_string(size - 1));
    if (call.send_tag < 0 || call.send_tag > tag_ub)
      return Invalid("jaxcache: '" + op->name + "' sends with tag " + std::to_string(call.send_tag) +
                     "; tags are 0.." + std::to_string(tag_ub));
    P2PHeader h;
    Status st = DescribeBuffer(*call.send, op->name, &op->dtype, &op->shape);
    if (!st.ok()) return st;
    h.dtype = static_cast<uint8_t>(op->dtype);
    h.ndim = static_cast<uint8_t>(op->shape.size());
    std::copy(op->shape.begin(), op->shape.end(), h.dims);
    h.payload_bytes = call.send->size_bytes();
    h.payload_inline = h.payload_bytes <= kP2PInlineBytes;
    h.name_bytes = static_cast<uint8_t>(std::min(op->name.size(), sizeof(h.name)));
    std::memcpy(h.name, op->name.data(), h.name_bytes);
    op->dest = static_cast<int>(call.dest);
    op->send_tag = static_cast<int>(call.send_tag);
    op->send_data = call.send->untyped_data();
    op->send_bytes = h.payload_bytes;
    op->send_msg_bytes = sizeof(h) + (h.payload_inline ? h.payload_bytes : 0);
    op->send_msg.reset(new char[op->send_msg_bytes]);
    std::memcpy(op->send_msg.get(), &h, sizeof(h));
    if (h.payload_inline && h.payload_bytes > 0)
      std::memcpy(op->send_msg.get() + sizeof(h), op->send_data, h.payload_bytes);
  }
  if (call.recv) {
    if (call.source != kAnySource && (call.source < 0 || call.source >= size))
      return Invalid("jaxcache: '" + op->name + "' receives from rank " + std::to_string(call.source) +
                     ", outside 0.." + std::to_string(size - 1));
    if (call.recv_tag != kAnyTag && (call.recv_tag < 0 || call.recv_tag > tag_ub))
      return Invalid("jaxcache: '" + op->name + "' receives with tag " + std::to_string(call.recv_tag) +
                     "; tags are 0.." + std::to_string(tag_ub) + " or ANY_TAG");
    Status st = DescribeBuffer(*call.recv, op->name, &op->dtype, &op->shape);
    if (!st.ok()) return st;
    op->has_recv = true;
    op->source = static_cast<int>(call.source);
    op->recv_tag = static_cast<int>(call.recv_tag);
    op->recv_data = call.recv->untyped_data();
    op->recv_bytes = call.recv->size_bytes();
    op->user_status = reinterpret_cast<MPI_Status*>(call.status);
  }
  return Status::Ok();
}

ffi::Future Launch(const P2PCall& call) {
  auto op = std::make_unique<P2POp>();
  Status st = Build(call, op.get());
  if (!st.ok()) {
    if (auto runtime = Runtime::Current()) runtime->p2p().RecordFailure(op->name, st);
    return Failed(st);
  }
  ffi::Promise promise;
  ffi::Future future(promise);
  op->done = Completion(
      [promise](const Status& s) mutable {
        if (s.ok()) promise.SetAvailable();
        else promise.SetError(ToFfiError(s, ffi::ErrorCode::kAborted));
      },
      /*cheap=*/false);
  Runtime::Current()->p2p().Start(std::move(op));
  return future;
}

ffi::Future SendImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::Token>, std::string_view name,
                     int64_t process_set, int64_t dest, int64_t tag) {
  P2PCall call;
  call.name = name;
  call.process_set = process_set;
  call.send = &x;
  call.dest = dest;
  call.send_tag = tag;
  return Launch(call);
}

ffi::Future RecvImpl(ffi::Token, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Token>,
                     std::string_view name, int64_t process_set, int64_t source, int64_t tag,
                     int64_t status) {
  P2PCall call;
  call.name = name;
  call.process_set = process_set;
  call.recv = &(*out);
  call.source = source;
  call.recv_tag = tag;
  call.status = status;
  return Launch(call);
}

ffi::Future SendrecvImpl(ffi::AnyBuffer x, ffi::Token, ffi::Result<ffi::AnyBuffer> out,
                         ffi::Result<ffi::Token>, std::string_view name, int64_t process_set,
                         int64_t source, int64_t dest, int64_t send_tag, int64_t recv_tag,
                         int64_t status) {
  P2PCall call;
  call.name = name;
  call.process_set = process_set;
  call.send = &x;
  call.dest = dest;
  call.send_tag = send_tag;
  call.recv = &(*out);
  call.source = source;
  call.recv_tag = recv_tag;
  call.status = status;
  return Launch(call);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SendHandler, SendImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::Token>()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("process_set")
                                  .Attr<int64_t>("dest")
                                  .Attr<int64_t>("tag"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RecvHandler, RecvImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("process_set")
                                  .Attr<int64_t>("source")
                                  .Attr<int64_t>("tag")
                                  .Attr<int64_t>("status"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(SendrecvHandler, SendrecvImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Token>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Token>()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("process_set")
                                  .Attr<int64_t>("source")
                                  .Attr<int64_t>("dest")
                                  .Attr<int64_t>("sendtag")
                                  .Attr<int64_t>("recvtag")
                                  .Attr<int64_t>("status"));

}  // namespace jaxcache
