// Python bindings (nanobind), and only they: process control and counters,
// process sets, the FFI handler capsules for jax.ffi.register_ffi_target, and
// the eager submit path (eager_handle.h, dlpack_submit.h).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unordered_map.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <stdexcept>

#include "allocator.h"
#include "comm.h"
#include "dlpack_submit.h"
#include "eager_handle.h"
#include "ffi_handlers.h"
#include "point_to_point_handlers.h"
#include "protocol_bindings.h"
#include "runtime.h"
#include "submission.h"
#ifdef JAXCACHE_WITH_CUDA
#include "cuda_handlers.h"
#endif

namespace nb = nanobind;
using namespace jaxcache;

namespace {

std::shared_ptr<Runtime> Running() {
  auto rt = Runtime::Current();
  if (!rt) throw std::runtime_error("jaxcache is not initialized: call jaxcache.init() first");
  return rt;
}

// Process set `id` of the running runtime; this rank must be a member.
std::shared_ptr<ProcessSet> SetOf(const Runtime& rt, int32_t id) {
  auto set = rt.Set(id);
  if (!set)
    throw std::invalid_argument("jaxcache: process set " + std::to_string(id) +
                                " is not registered on this rank (removed, or this rank is not a "
                                "member)");
  return set;
}

template <typename T>
nb::capsule Capsule(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

// The FFI targets by platform and the call-site state types.
void BindTargets(nb::module_& m) {
  m.def("ffi_api_version", [] { return std::make_pair(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR); });
  // Targets by platform: {"cpu": {...}, "CUDA": {...}} (CUDA only when built with it).
  m.def("registrations", [] {
    auto stages = [](auto* instantiate, auto* execute) {
      nb::dict d;
      d["instantiate"] = Capsule(instantiate);
      d["execute"] = Capsule(execute);
      return d;
    };
    nb::dict cpu;
#define JAXCACHE_REGISTER_CPU(E, name, target) \
  JAXCACHE_IF_XLA(target, cpu["jaxcache_" name] = stages(E##Instantiate, E##Handler);)
    JAXCACHE_KINDS(JAXCACHE_REGISTER_CPU)
#undef JAXCACHE_REGISTER_CPU
    cpu["jaxcache_rank"] = Capsule(RankHandler);
    cpu["jaxcache_send"] = Capsule(SendHandler);
    cpu["jaxcache_recv"] = Capsule(RecvHandler);
    cpu["jaxcache_sendrecv"] = Capsule(SendrecvHandler);
    nb::dict d;
    d["cpu"] = cpu;
#ifdef JAXCACHE_WITH_CUDA
    nb::dict cuda;
#define JAXCACHE_REGISTER_CUDA(E, name, target) \
  JAXCACHE_IF_XLA(target, cuda["jaxcache_" name] = stages(E##CudaInstantiate, E##CudaHandler);)
    JAXCACHE_KINDS(JAXCACHE_REGISTER_CUDA)
#undef JAXCACHE_REGISTER_CUDA
    cuda["jaxcache_rank"] = Capsule(RankCudaHandler);
    d["CUDA"] = cuda;
#endif
    return d;
  });
  // The call-site state type of each platform: {platform: (name, {type_id, type_info})}.
  m.def("call_site_types", [] {
    auto type = [](const char* name, void* id, void* info) {
      nb::dict d;
      d["type_id"] = nb::capsule(id);
      d["type_info"] = nb::capsule(info);
      return std::make_pair(std::string(name), d);
    };
    nb::dict d;
    d["cpu"] = type("jaxcache_call_site", CpuCallSiteTypeId(), CpuCallSiteTypeInfo());
#ifdef JAXCACHE_WITH_CUDA
    d["CUDA"] = type("jaxcache_call_site_cuda", CudaCallSiteTypeId(), CudaCallSiteTypeInfo());
#endif
    return d;
  });
}

void BindCuda(nb::module_& m) {
#ifdef JAXCACHE_WITH_CUDA
  m.def("cuda_built", [] { return true; });
  // (device count, "" or why CUDA cannot start). Starts the CUDA runtime:
  // call it only when asked, never at import.
  m.def("cuda_device_count", [] {
    std::string error;
    int n = CudaDeviceCount(&error);
    return std::make_pair(n, error);
  });
  m.def("cuda_runtime_version", [] { return CudaRuntimeVersion(); });
  m.def("cuda_staging_bytes", [] { return CudaStagingBytes(); });
#else
  m.def("cuda_built", [] { return false; });
#endif
}

// Starting and stopping the runtime, this rank, counters, the timeline.
void BindRuntime(nb::module_& m) {
  m.def(
      "init",
      [](uintptr_t comm_address, const nb::dict& config) {
        Config c = ConfigFromDict(config);
        MPI_Comm comm = *reinterpret_cast<MPI_Comm*>(comm_address);
        nb::gil_scoped_release release;
        Runtime::Start(comm, c);
      },
      nb::arg("comm_address"), nb::arg("config"));
  m.def(
      "shutdown",
      [](double timeout_s) {
        nb::gil_scoped_release release;
        return Runtime::Stop(timeout_s);
      },
      nb::arg("timeout_s") = 30.0);
  m.def("running", [] {
    auto rt = Runtime::Current();
    return rt && rt->running();
  });
  m.def("rank", [] { return Running()->comm().rank(); });
  m.def("size", [] { return Running()->comm().size(); });
  m.def("local_rank", [] { return Running()->comm().local_rank(); });
  m.def("local_size", [] { return Running()->comm().local_size(); });
  m.def(
      "set_rank", [](int32_t id) { return SetOf(*Running(), id)->comm().rank(); }, nb::arg("process_set"));
  m.def(
      "set_size", [](int32_t id) { return SetOf(*Running(), id)->comm().size(); }, nb::arg("process_set"));
  m.def(
      "stats", [](int32_t id) { return SetOf(*Running(), id)->stats().Snapshot(); },
      nb::arg("process_set") = 0);
  m.def(
      "reset_stats", [](int32_t id) { SetOf(*Running(), id)->stats().Reset(); },
      nb::arg("process_set") = 0);
  m.def(
      "cache_layout", [](int32_t id) { return SetOf(*Running(), id)->CacheLayout(); },
      nb::arg("process_set") = 0);
  m.def("max_mpi_count", [] { return Running()->comm().max_count(); });
  m.def(
      "start_timeline",
      [](const std::string& path, bool mark_cycles) {
        return Running()->StartTimeline(path, mark_cycles);
      },
      nb::arg("path"), nb::arg("mark_cycles") = false);
  m.def("stop_timeline", [] { Running()->StopTimeline(); });
}

void BindProcessSets(nb::module_& m) {
  m.def(
      "add_process_set",
      [](int32_t id, uintptr_t comm_address) {
        auto rt = Running();
        MPI_Comm comm = *reinterpret_cast<MPI_Comm*>(comm_address);
        nb::gil_scoped_release release;  // duplicating the communicator is collective
        rt->AddProcessSet(id, comm);
      },
      nb::arg("process_set"), nb::arg("comm_address"));
  m.def(
      "remove_process_set",
      [](int32_t id, double timeout_s) {
        auto rt = Running();
        nb::gil_scoped_release release;
        return rt->RemoveProcessSet(id, timeout_s);
      },
      nb::arg("process_set"), nb::arg("timeout_s") = 30.0);
  m.def("process_set_ids", [] { return Running()->SetIds(); });
}

// Eager requests: barrier, join, the DLPack submit path and their handles.
void BindEager(nb::module_& m) {
  m.def(
      "barrier",
      [](const std::string& name, int32_t process_set) {
        Submission s;
        s.name = name;
        s.process_set = process_set;
        s.sig.kind = Kind::kBarrier;
        return Track(std::move(s));
      },
      nb::arg("name"), nb::arg("process_set") = 0);

  m.def(
      "join",
      [](const std::string& name) {
        Submission s;
        s.name = name;
        s.sig.kind = Kind::kJoin;
        return Track(std::move(s), /*join_value=*/true);
      },
      nb::arg("name"));

  // The address the runtime would read: lets tests prove DLPack hand-over is zero-copy.
  m.def("data_pointer", [](InArray a) { return reinterpret_cast<uintptr_t>(a.data()); });

  nb::class_<Handle>(m, "Handle")
      .def("wait", &WaitInterruptibly)
      .def("poll", &Handle::Poll)
      .def("results", &Results)
      .def("rows", [](Handle& h) { return h.store ? h.store->rows : std::vector<int64_t>(); })
      .def("contributors", [](Handle& h) { return h.store ? h.store->contributors : 0; })
      .def("value", [](Handle& h) { return h.value; });
  // noconvert: an array that would need converting (non-contiguous, wrong device)
  // is refused instead of being silently copied -- results written into a
  // temporary copy would be lost.
  // (kind, message) of the last failure of the point-to-point op `name`, taken:
  // an eager call raises its class ((0, "") if none is recorded).
  m.def("take_p2p_failure", [](const std::string& name) {
    Status s = Running()->p2p().TakeFailure(name);
    return std::make_pair(static_cast<int>(s.kind), s.message);
  }, nb::arg("name"));
  m.def("submit", &SubmitArrays, nb::arg("kind"), nb::arg("name"), nb::arg("inputs").noconvert(),
        nb::arg("outputs").noconvert(), nb::arg("op") = 0, nb::arg("prescale") = 1.0,
        nb::arg("postscale") = 1.0, nb::arg("root") = 0,
        nb::arg("dtype_codes") = std::vector<int>(), nb::arg("refuse_if_in_flight") = false,
        nb::arg("device") = 0, nb::arg("process_set") = 0, nb::arg("world_size") = -1,
        nb::arg("drive") = true);
  m.def("submit_allocated", &SubmitAllocated, nb::arg("kind"), nb::arg("name"),
        nb::arg("inputs").noconvert(), nb::arg("splits") = std::vector<int64_t>(),
        nb::arg("dtype_codes") = std::vector<int>(), nb::arg("refuse_if_in_flight") = false,
        nb::arg("device") = 0, nb::arg("process_set") = 0, nb::arg("world_size") = -1,
        nb::arg("drive") = true);
}

}  // namespace

NB_MODULE(_jaxcache_ext, m) {
  m.doc() = "jaxcache C++ runtime";
  BindProtocol(m);
  // Handles held by module globals (or in flight at exit) outlive nanobind's
  // shutdown check; that is expected, not a reference-counting bug.
  nb::set_leak_warnings(false);
  SetMainThread(nb::cast<unsigned long>(nb::module_::import_("threading").attr("main_thread")().attr("ident")));
  m.def("waiters", [] { return EagerWaiters(); });
  m.def("advise_heap_huge_pages", &AdviseHeapHugePages, nb::arg("reserve"));
  BindTargets(m);
  BindCuda(m);
  BindRuntime(m);
  BindProcessSets(m);
  BindEager(m);
}
