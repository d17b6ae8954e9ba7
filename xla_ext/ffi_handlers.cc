#include "ffi_handlers.h"

#include <optional>
#include <string>
#include <string_view>

#include "runtime.h"

namespace ffi = xla::ffi;

namespace jaxcache {

namespace {

std::optional<DType> FromXla(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return DType::kBool;
    case ffi::DataType::S8: return DType::kInt8;
    case ffi::DataType::S16: return DType::kInt16;
    case ffi::DataType::S32: return DType::kInt32;
    case ffi::DataType::S64: return DType::kInt64;
    case ffi::DataType::U8: return DType::kUInt8;
    case ffi::DataType::U16: return DType::kUInt16;
    case ffi::DataType::U32: return DType::kUInt32;
    case ffi::DataType::U64: return DType::kUInt64;
    case ffi::DataType::F16: return DType::kFloat16;
    case ffi::DataType::BF16: return DType::kBFloat16;
    case ffi::DataType::F32: return DType::kFloat32;
    case ffi::DataType::F64: return DType::kFloat64;
    case ffi::DataType::C64: return DType::kComplex64;
    case ffi::DataType::C128: return DType::kComplex128;
    default: return std::nullopt;
  }
}

ffi::Future Failed(ffi::ErrorCode code, std::string message) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(ffi::Error(code, std::move(message)));
  return future;
}

// Prefix that lets Python map the XLA error back to an exception class.
const char* ErrorPrefix(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kMismatch: return "jaxcache.MismatchError: ";
    case ErrorKind::kStall: return "jaxcache.StallError: ";
    case ErrorKind::kShutdown: return "jaxcache.ShutdownError: ";
    case ErrorKind::kDuplicate: return "jaxcache.DuplicateNameError: ";
    default: return "jaxcache.CollectiveError: ";
  }
}

// Builds the request from XLA's buffers and hands it to the runtime.
ffi::Future Submit(Kind kind, ffi::RemainingArgs args, ffi::RemainingRets rets,
                   std::string_view name, ReduceOp op, double prescale, double postscale,
                   int32_t root) {
  auto runtime = Runtime::Current();
  if (!runtime || !runtime->running())
    return Failed(ffi::ErrorCode::kFailedPrecondition,
                  std::string(ErrorPrefix(ErrorKind::kShutdown)) +
                      "jaxcache is not initialized (call jaxcache.init() first) or has been shut "
                      "down; collective '" + std::string(name) + "' cannot run");
  if (args.size() != rets.size())
    return Failed(ffi::ErrorCode::kInvalidArgument, "jaxcache: operand/result count mismatch");
  auto req = std::make_unique<Request>();
  req->name = std::string(name);
  req->sig.kind = kind;
  req->sig.op = op;
  req->sig.prescale = prescale;
  req->sig.postscale = postscale;
  req->sig.root = root;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (!in.has_value() || !out.has_value())
      return Failed(ffi::ErrorCode::kInvalidArgument, "jaxcache: bad buffer");
    auto dtype = FromXla(in->element_type());
    if (!dtype)
      return Failed(ffi::ErrorCode::kInvalidArgument,
                    "jaxcache: unsupported dtype in collective '" + req->name + "'");
    TensorSpec spec;
    spec.dtype = *dtype;
    auto dims = in->dimensions();
    spec.shape.assign(dims.begin(), dims.end());
    req->sig.tensors.push_back(std::move(spec));
    req->inputs.push_back(in->untyped_data());
    req->outputs.push_back((*out)->untyped_data());
  }
  ffi::Promise promise;
  ffi::Future future(promise);
  req->done = [promise](const Status& st) mutable {
    if (st.ok()) promise.SetAvailable();
    else promise.SetError(ffi::Error(ffi::ErrorCode::kAborted, ErrorPrefix(st.kind) + st.message));
  };
  Status st = runtime->Submit(std::move(req));
  if (!st.ok())
    return Failed(ffi::ErrorCode::kAlreadyExists, ErrorPrefix(st.kind) + st.message);
  return future;
}

ffi::Future AllreduceImpl(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view name,
                          int64_t op, double prescale, double postscale) {
  return Submit(Kind::kAllreduce, args, rets, name, static_cast<ReduceOp>(op), prescale,
                postscale, 0);
}

ffi::Future BroadcastImpl(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view name,
                          int64_t root) {
  return Submit(Kind::kBroadcast, args, rets, name, ReduceOp::kSum, 1.0, 1.0,
                static_cast<int32_t>(root));
}

ffi::Future AllgatherImpl(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view name) {
  return Submit(Kind::kAllgather, args, rets, name, ReduceOp::kSum, 1.0, 1.0, 0);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AllreduceHandler, AllreduceImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(BroadcastHandler, BroadcastImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("name")
                                  .Attr<int64_t>("root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(AllgatherHandler, AllgatherImpl,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("name"));

}  // namespace jaxcache
