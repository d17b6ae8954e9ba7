// XLA FFI entry points (typed FFI). Every target has two stages:
//  - instantiate, once per custom-call instruction of a compiled program:
//    gives the instance its final collective name and keeps its attributes
//    (see CallSite);
//  - execute: builds the request and hands it to the runtime. On CPU the
//    execute stage is asynchronous: it returns an xla::ffi::Future completed
//    by the runtime's completion thread. The CUDA handlers
//    (cuda_handlers.h) share the instantiate stage and the request building.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common.h"
#include "request.h"
#include "submission.h"
#include "xla/ffi/api/ffi.h"

namespace jaxcache {

class Runtime;

// What one custom call of a collective asks for, from its attributes.
struct CollectiveCall {
  Kind kind = Kind::kAllreduce;
  int64_t world_size = 0;  // the size of the set the program was traced for
  int64_t process_set = 0;
  int64_t op = 0;  // a ReduceOp code, checked by PrepareRequest
  double prescale = 1.0;
  double postscale = 1.0;
  int64_t root = 0;
  bool over_devices = false;  // allreduce: Signature::over_devices
};

// Per-instruction state. JAX lowers a function called several times inside
// one program once and calls it from each site, so two instructions can carry
// the same name; instances of one (program, name) are told apart by the
// order in which XLA instantiates them, which is the same on every rank.
// The attributes are read once, here: the execute stage binds none (XLA then
// skips decoding them on every call; a per-leaf call is a few microseconds).
struct CallSite {
  std::string name;
  CollectiveCall call;
  // The program's devices of this process, by ordinal, in device-position
  // order; empty for a program on one device (device_parts.h).
  std::vector<int32_t> devices;
  // The position of the device with XLA's `ordinal`, or -1.
  int PositionOf(int32_t ordinal) const;
};

// The state type XLA sees is one per platform: jaxlib and each PJRT plugin
// (CUDA) keep FFI type registries of their own and number types
// independently, so one TypeId registered with both would carry the first
// registry's number into the second, where another type may already have it.
struct CpuCallSite : CallSite {
  static xla::ffi::TypeId id;
};
// For jax.ffi.register_ffi_type.
void* CpuCallSiteTypeId();
void* CpuCallSiteTypeInfo();

// "name" for the first instance of (program, name), then "name~1", ...
std::string InstanceName(std::string_view name, int64_t program);

// The instantiate stage of kind `kKind`'s target, for the state type `Site`:
// binds the attributes (JAXCACHE_FFI_ATTRS) and keeps them in the site.
template <typename Site, Kind kKind>
xla::ffi::ErrorOr<std::unique_ptr<Site>> Instantiate(std::string_view name, int64_t program, int64_t world_size,
                                                     int64_t process_set, int64_t op, double prescale,
                                                     double postscale, int64_t root,
                                                     xla::ffi::Span<const int64_t> devices, int64_t over_devices) {
  auto site = std::make_unique<Site>();
  site->name = InstanceName(name, program);
  site->call = {.kind = kKind, .world_size = world_size, .process_set = process_set, .op = op, .prescale = prescale,
                .postscale = postscale, .root = root, .over_devices = over_devices != 0};
  if (devices.size() > 1) site->devices.assign(devices.begin(), devices.end());
  return site;
}

// What one execution submits, over XLA's buffers (host or device addresses, as
// `device` says; the caller decides what the runtime gets to touch), or, when
// `status` is not ok, why it cannot.
struct DescribedCall {
  Submission submission;
  Status status;
};
DescribedCall Describe(const CollectiveCall& call, const CallSite& site, Device device,
                       xla::ffi::RemainingArgs args, xla::ffi::RemainingRets rets);

// Hands one execution to the runtime: on a one-device program as its own
// request; on several devices as this device's part of the request of every
// device's execution of `run` (device_parts.h). `done` runs once, with the
// outcome (also when the call cannot be submitted at all).
void Dispatch(const CallSite& site, int64_t run, int32_t ordinal, DescribedCall call, Completion done);

// jaxcache's dtype for XLA's, if it has one.
std::optional<DType> FromXla(xla::ffi::DataType t);

// A future that has already failed with `status`.
xla::ffi::Future Failed(const Status& status);

// The XLA error for a failed request: the message starts with the name of the
// Python exception class it maps to (jaxcache/errors.py).
xla::ffi::Error ToFfiError(const Status& status, xla::ffi::ErrorCode code);

// This process's rank in `process_set`, or an error when the runtime is not
// running or this rank is not a member.
xla::ffi::ErrorOr<int32_t> RunningRank(int64_t process_set);

// The attributes of every target, bound by the instantiate stage on every
// platform (XLA checks the count where any is bound); a kind ignores those it
// has no use for (jaxcache/ops/lowering.py passes them all).
#define JAXCACHE_FFI_ATTRS                  \
  .Attr<std::string_view>("name")           \
      .Attr<int64_t>("program")             \
      .Attr<int64_t>("world_size")          \
      .Attr<int64_t>("process_set")         \
      .Attr<int64_t>("op")                  \
      .Attr<double>("prescale")             \
      .Attr<double>("postscale")            \
      .Attr<int64_t>("root")                \
      .Attr<xla::ffi::Span<const int64_t>>("devices")  \
      .Attr<int64_t>("over_devices")

// One instantiate stage and one handler per kind with an XLA target
// (collectives/kinds.h): <Kind>Instantiate, <Kind>Handler.
#define JAXCACHE_DECLARE_TARGET(E, name, target) \
  JAXCACHE_IF_XLA(target, XLA_FFI_DECLARE_HANDLER_SYMBOL(E##Instantiate); XLA_FFI_DECLARE_HANDLER_SYMBOL(E##Handler);)
JAXCACHE_KINDS(JAXCACHE_DECLARE_TARGET)
#undef JAXCACHE_DECLARE_TARGET
// Synchronous: this process's rank in a process set, read when the program runs.
XLA_FFI_DECLARE_HANDLER_SYMBOL(RankHandler);

}  // namespace jaxcache
