#include "ffi_handlers.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "collectives/collective.h"
#include "device_parts.h"
#include "runtime.h"

namespace ffi = xla::ffi;

namespace jaxcache {

ffi::TypeId CpuCallSite::id = {};

namespace {

XLA_FFI_TypeInfo cpu_call_site_type_info = ffi::MakeTypeInfo<CpuCallSite>();

// XLA reports a failed custom call as its own exception type; the message
// starts with the class an eager call would raise, for the reader.
std::string ErrorPrefix(ErrorKind kind) {
  return std::string("jaxcache.") + (kind == ErrorKind::kNone ? "CollectiveError" : ErrorClassName(kind)) + ": ";
}

// Fulfils `promise` with a request's outcome. XLA:CPU resumes the program's
// dependent work on the thread that does so: the completion thread, or on a
// program over several devices the device's own (DeviceThreads).
Completion FulfilPromise(ffi::Promise promise, int position) {
  auto fulfil = [promise](const Status& st) mutable {
    if (st.ok()) promise.SetAvailable();
    else promise.SetError(ToFfiError(st, ffi::ErrorCode::kAborted));
  };
  if (position < 0) return Completion(std::move(fulfil), /*cheap=*/false);
  return Completion(
      [fulfil, position](const Status& st) {
        DeviceThreads::Get().Post(position, [fulfil, st]() mutable { fulfil(st); });
      },
      /*cheap=*/true);
}

// Hands the call to the runtime; XLA:CPU resumes dependent work when the
// promise is fulfilled.
ffi::Future Submit(const CpuCallSite& site, ffi::RunId run, int32_t ordinal, ffi::RemainingArgs args,
                   ffi::RemainingRets rets) {
  DescribedCall described = Describe(site.call, site, Device::kCpu, args, rets);
  if (site.devices.empty() && !described.status.ok()) return Failed(described.status);
  ffi::Promise promise;
  ffi::Future future(promise);
  const int position = site.devices.empty() ? -1 : std::max(0, site.PositionOf(ordinal));
  Dispatch(site, run.run_id, ordinal, std::move(described), FulfilPromise(promise, position));
  return future;
}

// The execute stage of every kind's target: the instruction's site holds its call.
ffi::Future CollectiveImpl(CpuCallSite* site, ffi::RunId run, int32_t ordinal, ffi::RemainingArgs args,
                           ffi::RemainingRets rets) {
  return Submit(*site, run, ordinal, args, rets);
}

// Submits a prepared request, or completes `done` with why it could not be prepared.
void SubmitPrepared(PreparedRequest prepared, Completion done) {
  if (!prepared.request) {
    done.Run(prepared.status);
    return;
  }
  prepared.request->done = std::move(done);
  const bool drive = prepared.request->sig.NumBytes() <= kInlineBytes;
  prepared.runtime->Submit(std::move(prepared.request), drive);
}

// The last device's part to arrive submits the request of them all.
void SubmitParts(std::vector<DevicePart> parts) {
  Submission joined;
  PreparedRequest prepared;
  prepared.status = JoinParts(parts, joined);
  if (prepared.status.ok()) prepared = MakeRequest(std::move(joined));
  if (prepared.request)
    if (auto set = prepared.runtime->Set(prepared.request->process_set)) {
      ++set->stats().device_requests;
      set->stats().device_parts += static_cast<int64_t>(parts.size());
    }
  SubmitPrepared(std::move(prepared), CompletionOfAll(parts));
}

ffi::Error RankImpl(ffi::Result<ffi::Buffer<ffi::S32>> out, int64_t process_set) {
  auto rank = RunningRank(process_set);
  if (rank.has_error()) return rank.error();
  *out->typed_data() = rank.value();
  return ffi::Error::Success();
}

}  // namespace

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

ffi::Future Failed(const Status& status) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(ToFfiError(status, ffi::ErrorCode::kFailedPrecondition));
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

int CallSite::PositionOf(int32_t ordinal) const {
  for (std::size_t p = 0; p < devices.size(); ++p)
    if (devices[p] == ordinal) return static_cast<int>(p);
  return -1;
}

DescribedCall Describe(const CollectiveCall& call, const CallSite& site, Device device, ffi::RemainingArgs args,
                       ffi::RemainingRets rets) {
  DescribedCall d;
  Submission& s = d.submission;
  s.name = site.name;
  s.world_size = call.world_size;
  s.sig.kind = call.kind;
  s.sig.op = static_cast<ReduceOp>(call.op);
  s.sig.prescale = call.prescale;
  s.sig.postscale = call.postscale;
  s.sig.root = static_cast<int32_t>(call.root);
  s.sig.device = device;
  s.sig.over_devices = call.over_devices;
  // XLA's result buffers are sized for equal shapes (blocks) on every rank.
  s.sig.static_shapes = CollectiveOf(call.kind).AgreedSizes();
  s.process_set = static_cast<int32_t>(call.process_set);
  auto fail = [&](std::string message) {
    d.status = Status::Error(ErrorKind::kInvalidArgument, std::move(message));
    return std::move(d);
  };
  if (call.op < 0 || call.op >= kNumReduceOps)
    return fail("jaxcache: '" + s.name + "' was lowered with reduce op code " + std::to_string(call.op) +
                ", which names no ReduceOp");
  if (call.root < INT32_MIN || call.root > INT32_MAX)
    return fail("jaxcache: '" + s.name + "' was lowered with root " + std::to_string(call.root));
  if (args.size() != rets.size())
    return fail("jaxcache: operand/result count mismatch in '" + s.name + "'");
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (!in.has_value() || !out.has_value()) return fail("jaxcache: bad buffer in '" + s.name + "'");
    auto dtype = FromXla(in->element_type());
    if (!dtype) return fail("jaxcache: unsupported dtype in collective '" + s.name + "'");
    if ((*out)->element_type() != in->element_type())
      return fail("jaxcache: result " + std::to_string(i) + " of '" + s.name + "' has another dtype than its operand");
    TensorSpec spec;
    spec.dtype = *dtype;
    auto dims = in->dimensions();
    spec.shape.assign(dims.begin(), dims.end());
    s.sig.tensors.push_back(std::move(spec));
    s.inputs.push_back(in->untyped_data());
    s.outputs.push_back((*out)->untyped_data());
    s.output_bytes.push_back((*out)->size_bytes());
  }
  return d;
}

namespace {

// Reports (and past JAXCACHE_STALL_SHUTDOWN_TIME fails) the collectives whose
// executions wait for devices of their program that never ran them: a thread
// that sleeps while nothing waits, and looks once a second while something
// does. It touches nothing but the (never destroyed) rendezvous: it may wake
// while the process exits.
void WatchDeviceStalls() {
  NameThisThread("jaxcache-devwait");
  DeviceRendezvous& rendezvous = DeviceRendezvous::Get();
  for (;;) {
    rendezvous.AwaitWaiting(std::chrono::hours(1));
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::vector<DevicePart> expired;
    for (const std::string& warning : rendezvous.Inspect(Clock::now(), &expired))
      std::fprintf(stderr, "%s\n", warning.c_str());
    for (DevicePart& p : expired) p.done.Run(p.status);
  }
}

StallLimits LimitsOf(const std::shared_ptr<Runtime>& runtime) {
  static std::once_flag watch;
  std::call_once(watch, [] { std::thread(WatchDeviceStalls).detach(); });
  if (!runtime) return {};
  return {runtime->config().stall_check_s, runtime->config().stall_shutdown_s,
          "rank " + std::to_string(runtime->comm().rank()) + ": "};
}

}  // namespace

void Dispatch(const CallSite& site, int64_t run, int32_t ordinal, DescribedCall call, Completion done) {
  if (site.devices.empty()) {
    if (!call.status.ok()) return done.Run(call.status);
    return SubmitPrepared(MakeRequest(std::move(call.submission)), std::move(done));
  }
  DevicePart part{site.PositionOf(ordinal), std::move(call.submission), std::move(call.status), std::move(done)};
  if (part.position < 0 && part.status.ok())
    part.status = Status::Error(ErrorKind::kInternal, "jaxcache: '" + site.name + "' ran on device " +
                                                          std::to_string(ordinal) + ", which its program does not list");
  const int devices = static_cast<int>(site.devices.size());
  std::vector<DevicePart> parts =
      DeviceRendezvous::Get().Arrive(&site, run, devices, std::move(part), LimitsOf(Runtime::Current()));
  if (!parts.empty()) SubmitParts(std::move(parts));
}

ffi::Error ToFfiError(const Status& status, ffi::ErrorCode code) {
  return ffi::Error(code, ErrorPrefix(status.kind) + status.message);
}

ffi::ErrorOr<int32_t> RunningRank(int64_t process_set) {
  auto runtime = Runtime::Current();
  if (!runtime || !runtime->running())
    return ffi::Unexpected<ffi::Error>(ToFfiError(
        Status::Error(ErrorKind::kShutdown, "jaxcache is not initialized (call jaxcache.init())"),
        ffi::ErrorCode::kFailedPrecondition));
  auto set = runtime->Set(static_cast<int32_t>(process_set));
  if (!set)
    return ffi::Unexpected<ffi::Error>(ToFfiError(
        Status::Error(ErrorKind::kInvalidArgument,
                      NotAMember(static_cast<int32_t>(process_set), runtime->comm().rank())),
        ffi::ErrorCode::kFailedPrecondition));
  return set->comm().rank();
}

void* CpuCallSiteTypeId() { return &CpuCallSite::id; }
void* CpuCallSiteTypeInfo() { return &cpu_call_site_type_info; }

#define JAXCACHE_CPU_BIND                                                                        \
  ffi::Ffi::Bind().Ctx<ffi::State<CpuCallSite>>().Ctx<ffi::RunId>().Ctx<ffi::DeviceOrdinal>() \
      .RemainingArgs().RemainingRets()

#define JAXCACHE_DEFINE_TARGET(E, name, target)                                                     \
  JAXCACHE_IF_XLA(target,                                                                           \
                  XLA_FFI_DEFINE_HANDLER_SYMBOL(E##Instantiate, (Instantiate<CpuCallSite, Kind::k##E>), \
                                                ffi::Ffi::BindInstantiate() JAXCACHE_FFI_ATTRS);     \
                  XLA_FFI_DEFINE_HANDLER_SYMBOL(E##Handler, CollectiveImpl, JAXCACHE_CPU_BIND);)
JAXCACHE_KINDS(JAXCACHE_DEFINE_TARGET)
#undef JAXCACHE_DEFINE_TARGET

XLA_FFI_DEFINE_HANDLER_SYMBOL(RankHandler, RankImpl,
                              ffi::Ffi::Bind().Ret<ffi::Buffer<ffi::S32>>().Attr<int64_t>("process_set"));

}  // namespace jaxcache
