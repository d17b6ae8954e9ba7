#include "ffi_handlers.h"

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "runtime.h"

namespace ffi = xla::ffi;

namespace jaxcache {

ffi::TypeId CallSite::id = {};

namespace {

XLA_FFI_TypeInfo call_site_type_info = ffi::MakeTypeInfo<CallSite>();

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

ffi::Future Failed(ErrorKind kind, const std::string& message) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(ffi::Error(ffi::ErrorCode::kFailedPrecondition, ErrorPrefix(kind) + message));
  return future;
}

// Numbers the instances of each (program, name) in instantiation order.
std::string InstanceName(std::string_view name, int64_t program) {
  static std::mutex mu;
  static std::map<std::pair<int64_t, std::string>, int> instances;
  std::lock_guard<std::mutex> lock(mu);
  int k = instances[{program, std::string(name)}]++;
  return k == 0 ? std::string(name) : std::string(name) + "~" + std::to_string(k);
}

ffi::ErrorOr<std::unique_ptr<CallSite>> Instantiate(std::string_view name, int64_t program) {
  auto site = std::make_unique<CallSite>();
  site->name = InstanceName(name, program);
  return site;
}

// What a program traced for one world size must not do on another.
std::string CheckWorld(const std::string& name, int64_t traced_size, int size) {
  if (traced_size == size) return "";
  return "jaxcache: collective '" + name + "' was traced for " + std::to_string(traced_size) +
         " ranks but the runtime now has " + std::to_string(size) +
         " (jaxcache.init() was called with another communicator since); trace the function "
         "again, e.g. after jax.clear_caches()";
}

// Builds the request from XLA's buffers and hands it to the runtime.
ffi::Future Submit(Kind kind, const CallSite& site, ffi::RemainingArgs args,
                   ffi::RemainingRets rets, int64_t world_size, ReduceOp op, double prescale,
                   double postscale, int32_t root) {
  const std::string& name = site.name;
  auto runtime = Runtime::Current();
  if (!runtime || !runtime->running())
    return Failed(ErrorKind::kShutdown,
                  "jaxcache is not initialized (call jaxcache.init() first) or has been shut "
                  "down; collective '" + name + "' cannot run");
  const int size = runtime->comm().size();
  std::string wrong_world = CheckWorld(name, world_size, size);
  if (!wrong_world.empty()) return Failed(ErrorKind::kInvalidArgument, wrong_world);
  if (args.size() != rets.size())
    return Failed(ErrorKind::kInvalidArgument, "jaxcache: operand/result count mismatch in '" + name + "'");
  auto req = std::make_unique<Request>();
  req->name = name;
  req->sig.kind = kind;
  req->sig.op = op;
  req->sig.prescale = prescale;
  req->sig.postscale = postscale;
  req->sig.root = root;
  // XLA's result buffers are sized for equal shapes (blocks) on every rank.
  req->sig.static_shapes = kind == Kind::kAllgather || kind == Kind::kAlltoall;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (!in.has_value() || !out.has_value())
      return Failed(ErrorKind::kInvalidArgument, "jaxcache: bad buffer in '" + name + "'");
    auto dtype = FromXla(in->element_type());
    if (!dtype)
      return Failed(ErrorKind::kInvalidArgument, "jaxcache: unsupported dtype in collective '" + name + "'");
    TensorSpec spec;
    spec.dtype = *dtype;
    auto dims = in->dimensions();
    spec.shape.assign(dims.begin(), dims.end());
    const std::size_t want = ResultBytes(kind, spec, runtime->comm().rank(), size);
    if ((*out)->size_bytes() != want || (*out)->element_type() != in->element_type())
      return Failed(ErrorKind::kInvalidArgument,
                    "jaxcache: result " + std::to_string(i) + " of '" + name + "' has " +
                        std::to_string((*out)->size_bytes()) + " bytes but the collective writes " +
                        std::to_string(want));
    req->sig.tensors.push_back(std::move(spec));
    req->inputs.push_back(in->untyped_data());
    req->outputs.push_back((*out)->untyped_data());
  }
  ffi::Promise promise;
  ffi::Future future(promise);
  req->done = Completion(
      [promise](const Status& st) mutable {
        if (st.ok()) promise.SetAvailable();
        else promise.SetError(ffi::Error(ffi::ErrorCode::kAborted, ErrorPrefix(st.kind) + st.message));
      },
      /*cheap=*/false);
  runtime->Submit(std::move(req));
  return future;
}

ffi::Future AllreduceImpl(CallSite* site, ffi::RemainingArgs args, ffi::RemainingRets rets,
                          std::string_view, int64_t, int64_t world_size, int64_t op,
                          double prescale, double postscale) {
  return Submit(Kind::kAllreduce, *site, args, rets, world_size, static_cast<ReduceOp>(op),
                prescale, postscale, 0);
}

ffi::Future BroadcastImpl(CallSite* site, ffi::RemainingArgs args, ffi::RemainingRets rets,
                          std::string_view, int64_t, int64_t world_size, int64_t root) {
  return Submit(Kind::kBroadcast, *site, args, rets, world_size, ReduceOp::kSum, 1.0, 1.0,
                static_cast<int32_t>(root));
}

ffi::Future AllgatherImpl(CallSite* site, ffi::RemainingArgs args, ffi::RemainingRets rets,
                          std::string_view, int64_t, int64_t world_size) {
  return Submit(Kind::kAllgather, *site, args, rets, world_size, ReduceOp::kSum, 1.0, 1.0, 0);
}

ffi::Future ReducescatterImpl(CallSite* site, ffi::RemainingArgs args, ffi::RemainingRets rets,
                              std::string_view, int64_t, int64_t world_size, int64_t op,
                              double prescale, double postscale) {
  return Submit(Kind::kReducescatter, *site, args, rets, world_size, static_cast<ReduceOp>(op),
                prescale, postscale, 0);
}

ffi::Future AlltoallImpl(CallSite* site, ffi::RemainingArgs args, ffi::RemainingRets rets,
                         std::string_view, int64_t, int64_t world_size) {
  return Submit(Kind::kAlltoall, *site, args, rets, world_size, ReduceOp::kSum, 1.0, 1.0, 0);
}

ffi::ErrorOr<std::unique_ptr<CallSite>> InstantiateReduce(std::string_view name, int64_t program,
                                                          int64_t, int64_t, double, double) {
  return Instantiate(name, program);
}
ffi::ErrorOr<std::unique_ptr<CallSite>> InstantiateBroadcast(std::string_view name,
                                                             int64_t program, int64_t, int64_t) {
  return Instantiate(name, program);
}
ffi::ErrorOr<std::unique_ptr<CallSite>> InstantiateGather(std::string_view name, int64_t program,
                                                          int64_t) {
  return Instantiate(name, program);
}

ffi::Error RankImpl(ffi::Result<ffi::Buffer<ffi::S32>> out) {
  auto runtime = Runtime::Current();
  if (!runtime || !runtime->running())
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "jaxcache.ShutdownError: jaxcache is not initialized (call jaxcache.init())");
  *out->typed_data() = runtime->comm().rank();
  return ffi::Error::Success();
}

}  // namespace

void* CallSiteTypeId() { return &CallSite::id; }
void* CallSiteTypeInfo() { return &call_site_type_info; }

// Every attribute is bound at both stages (XLA checks the count).
#define JAXCACHE_COMMON_ATTRS \
  .Attr<std::string_view>("name").Attr<int64_t>("program").Attr<int64_t>("world_size")

XLA_FFI_DEFINE_HANDLER_SYMBOL(AllreduceInstantiate, InstantiateReduce,
                              ffi::Ffi::BindInstantiate() JAXCACHE_COMMON_ATTRS
                                  .Attr<int64_t>("op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(AllreduceHandler, AllreduceImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<CallSite>>()
                                  .RemainingArgs()
                                  .RemainingRets() JAXCACHE_COMMON_ATTRS
                                  .Attr<int64_t>("op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(BroadcastInstantiate, InstantiateBroadcast,
                              ffi::Ffi::BindInstantiate() JAXCACHE_COMMON_ATTRS
                                  .Attr<int64_t>("root"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(BroadcastHandler, BroadcastImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<CallSite>>()
                                  .RemainingArgs()
                                  .RemainingRets() JAXCACHE_COMMON_ATTRS
                                  .Attr<int64_t>("root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ReducescatterInstantiate, InstantiateReduce,
                              ffi::Ffi::BindInstantiate() JAXCACHE_COMMON_ATTRS
                                  .Attr<int64_t>("op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(ReducescatterHandler, ReducescatterImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<CallSite>>()
                                  .RemainingArgs()
                                  .RemainingRets() JAXCACHE_COMMON_ATTRS
                                  .Attr<int64_t>("op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(AlltoallInstantiate, InstantiateGather,
                              ffi::Ffi::BindInstantiate() JAXCACHE_COMMON_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(AlltoallHandler, AlltoallImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<CallSite>>()
                                  .RemainingArgs()
                                  .RemainingRets() JAXCACHE_COMMON_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(AllgatherInstantiate, InstantiateGather,
                              ffi::Ffi::BindInstantiate() JAXCACHE_COMMON_ATTRS);
XLA_FFI_DEFINE_HANDLER_SYMBOL(AllgatherHandler, AllgatherImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::State<CallSite>>()
                                  .RemainingArgs()
                                  .RemainingRets() JAXCACHE_COMMON_ATTRS);

}  // namespace jaxcache

namespace jaxcache {
XLA_FFI_DEFINE_HANDLER_SYMBOL(RankHandler, RankImpl, ffi::Ffi::Bind().Ret<ffi::Buffer<ffi::S32>>());
}  // namespace jaxcache
