#include "submission.h"

#include "collectives/collective.h"
#include "runtime.h"

namespace jaxcache {
namespace {

PreparedRequest Failure(ErrorKind kind, std::string message) {
  PreparedRequest p;
  p.status = Status::Error(kind, std::move(message));
  return p;
}

// What a request prepared for one size of its set must not do on another.
std::string WrongWorld(const std::string& name, int64_t prepared, int size, int32_t set) {
  std::string where = set == 0 ? "the runtime now has " : "process set " + std::to_string(set) + " now has ";
  return "jaxcache: collective '" + name + "' was traced for " + std::to_string(prepared) +
         " ranks but " + where + std::to_string(size) +
         " (jaxcache.init() or add_process_set() was called again since); trace the function "
         "again, e.g. after jax.clear_caches()";
}

// Why a reduction over the devices cannot run: only an allreduce reduces over
// them, and every device's tensors must have the same shapes and dtypes.
std::string OverDevicesError(const std::string& name, const Signature& sig) {
  if (!sig.over_devices) return "";
  if (sig.kind != Kind::kAllreduce)
    return "jaxcache: '" + name + "': a " + KindName(sig.kind) + " cannot reduce over the devices (axis_name)";
  const std::size_t per = sig.tensors.size() / sig.devices;
  for (std::size_t t = per; t < sig.tensors.size(); ++t)
    if (!(sig.tensors[t] == sig.tensors[t % per]))
      return "jaxcache: '" + name + "' reduces over " + std::to_string(sig.devices) + " devices, but tensor " +
             std::to_string(t % per) + " of device position " + std::to_string(t / per) + " (" +
             sig.tensors[t].ShapeString() + ") differs from position 0's (" + sig.tensors[t % per].ShapeString() +
             ") in shape or dtype";
  return "";
}

}  // namespace

std::string NotAMember(int32_t set, int rank) {
  return "jaxcache: process set " + std::to_string(set) + " is not registered on rank " +
         std::to_string(rank) + " (it was removed, or this rank is not a member)";
}

PreparedRequest MakeRequest(Submission s) {
  const std::string& name = s.name;
  auto runtime = Runtime::Current();
  if (!runtime || !runtime->running())
    return Failure(ErrorKind::kShutdown,
                   "jaxcache is not initialized (call jaxcache.init() first) or has been shut "
                   "down; collective '" + name + "' cannot run");
  auto set = runtime->Set(s.process_set);
  if (!set)
    return Failure(ErrorKind::kInvalidArgument, NotAMember(s.process_set, runtime->comm().rank()) +
                                                    "; collective '" + name + "' cannot run");
  const Comm& comm = set->comm();
  if (s.world_size >= 0 && s.world_size != comm.size())
    return Failure(ErrorKind::kInvalidArgument, WrongWorld(name, s.world_size, comm.size(), s.process_set));
  const std::size_t n = s.sig.tensors.size();
  const Collective& collective = CollectiveOf(s.sig.kind);
  if (s.inputs.size() != n)
    return Failure(ErrorKind::kInvalidArgument, "jaxcache: '" + name + "' has " + std::to_string(n) +
                                                    " tensors but " + std::to_string(s.inputs.size()) + " inputs");
  if (std::string why = OverDevicesError(name, s.sig); !why.empty())
    return Failure(ErrorKind::kInvalidArgument, why);
  if (s.allocate_outputs) {
    if (!collective.AgreedSizes())
      return Failure(ErrorKind::kInvalidArgument,
                     std::string("jaxcache: a ") + KindName(s.sig.kind) + " cannot allocate its outputs");
    if (!s.outputs.empty())
      return Failure(ErrorKind::kInvalidArgument, "jaxcache: '" + name + "' has outputs to allocate and given");
  } else {
    if (s.outputs.size() != n || s.output_bytes.size() != n)
      return Failure(ErrorKind::kInvalidArgument, "jaxcache: inputs and outputs of '" + name + "' differ in number");
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t want = collective.ResultBytes(s.sig, s.sig.tensors[i], comm.rank(), comm.size());
      if (s.output_bytes[i] != want)
        return Failure(ErrorKind::kInvalidArgument,
                       "jaxcache: result " + std::to_string(i) + " of '" + name + "' has " +
                           std::to_string(s.output_bytes[i]) + " bytes but the collective writes " +
                           std::to_string(want));
    }
  }
  PreparedRequest p;
  p.runtime = std::move(runtime);
  p.request = std::make_unique<Request>();
  Request& req = *p.request;
  req.name = std::move(s.name);
  req.process_set = s.process_set;
  req.sig = std::move(s.sig);
  req.inputs = std::move(s.inputs);
  req.refuse_if_in_flight = s.refuse_if_in_flight;
  if (s.allocate_outputs) {
    req.outputs.assign(n, nullptr);
    req.store = std::make_shared<OutputStore>();
  } else {
    req.outputs = std::move(s.outputs);
  }
  return p;
}

}  // namespace jaxcache
