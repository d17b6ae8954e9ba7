// Python bindings (nanobind): process control, counters, the FFI handler
// capsules for jax.ffi.register_ffi_target, and a DLPack-based submit path
// used by eager JAX calls and by the PyTorch / TensorFlow bridges.
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

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "allocator.h"
#include "collectives/collective.h"
#include "comm.h"
#include "ffi_handlers.h"
#include "point_to_point_handlers.h"
#include "protocol_bindings.h"
#include "submission.h"
#include "runtime.h"
#ifdef JAXCACHE_WITH_CUDA
#include "cuda_handlers.h"
#endif

namespace nb = nanobind;
using namespace jaxcache;

namespace {

// Completion state of one eagerly submitted request.
struct Handle {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  // Outputs the executor allocated (allgather with agreed sizes, alltoall).
  std::shared_ptr<OutputStore> store;
  int32_t value = -1;  // join(): the rank that joined last
  // Submitted without driving (an async call): its first waiter drives it.
  std::weak_ptr<Runtime> runtime;
  int32_t process_set = 0;

  void Finish(const Status& st) {
    std::lock_guard<std::mutex> lock(mu);
    status = st;
    done = true;
    cv.notify_all();
  }
  bool WaitFor(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return done; });
  }
  bool Poll() {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
};

// Threads inside Handle.wait(): interpreter exit waits for them to leave (see
// wait_for_waiters) -- a thread still in C++ when Python finalizes would be
// ended inside a C++ frame, which aborts the process.
std::atomic<int> waiters{0};
unsigned long main_thread_ident = 0;

// Waits without the GIL. The main thread waits in slices and runs Python's
// signal handlers between them, so Ctrl-C raises KeyboardInterrupt within a
// slice; other threads (which never receive signals) wait in one piece. An
// interrupted request stays in flight: its caller keeps the buffers alive.
std::pair<int, std::string> WaitInterruptibly(Handle& h) {
  constexpr std::chrono::milliseconds kSlice{50};
  const bool main_thread = PyThread_get_thread_ident() == main_thread_ident;
  struct Count {
    Count() { ++waiters; }
    ~Count() { --waiters; }
  } count;
  if (auto runtime = h.runtime.lock(); runtime && !h.Poll()) {
    nb::gil_scoped_release release;
    runtime->DriveUntil(h.process_set, [&h] { return h.Poll(); });
  }
  for (;;) {
    bool done;
    {
      nb::gil_scoped_release release;
      done = h.WaitFor(main_thread ? kSlice : std::chrono::hours(24));
    }
    if (done) break;
    if (main_thread && PyErr_CheckSignals() != 0) throw nb::python_error();
  }
  std::lock_guard<std::mutex> lock(h.mu);
  return {static_cast<int>(h.status.kind), h.status.message};
}

DType FromDlpack(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  auto code = static_cast<C>(t.code);
  if (t.lanes != 1) throw std::invalid_argument("jaxcache: vector dtypes are not supported");
  switch (code) {
    case C::Bool: return DType::kBool;
    case C::Int:
      switch (t.bits) {
        case 8: return DType::kInt8; case 16: return DType::kInt16;
        case 32: return DType::kInt32; case 64: return DType::kInt64;
      }
      break;
    case C::UInt:
      switch (t.bits) {
        case 8: return DType::kUInt8; case 16: return DType::kUInt16;
        case 32: return DType::kUInt32; case 64: return DType::kUInt64;
      }
      break;
    case C::Float:
      switch (t.bits) {
        case 16: return DType::kFloat16; case 32: return DType::kFloat32; case 64: return DType::kFloat64;
      }
      break;
    case C::Bfloat:
      if (t.bits == 16) return DType::kBFloat16;
      break;
    case C::Complex:
      switch (t.bits) {
        case 64: return DType::kComplex64; case 128: return DType::kComplex128;
      }
      break;
    default: break;
  }
  throw std::invalid_argument("jaxcache: unsupported dtype (code " + std::to_string(t.code) +
                              ", " + std::to_string(t.bits) + " bits)");
}

using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<nb::c_contig, nb::device::cpu>;

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

// Submits `s` with a handle for its outcome; a submission the runtime refuses
// gives a handle that has failed already (its wait() returns why).
// `drive`: the submitter drives small requests' cycles itself (a blocking call);
// otherwise (an async call) it returns at once and the first waiter drives.
std::shared_ptr<Handle> Track(Submission s, bool join_value = false, bool drive = true) {
  auto handle = std::make_shared<Handle>();
  PreparedRequest p = MakeRequest(std::move(s));
  if (!p.request) {
    handle->Finish(p.status);
    return handle;
  }
  RequestPtr req = std::move(p.request);
  if (join_value) req->outputs.push_back(&handle->value);  // the handle outlives the request
  handle->store = req->store;
  req->done = Completion([handle](const Status& st) { handle->Finish(st); }, /*cheap=*/true);
  const bool small = req->sig.NumBytes() <= kInlineBytes;
  if (!drive && small) {
    handle->runtime = p.runtime;
    handle->process_set = req->process_set;
  }
  nb::gil_scoped_release release;  // driving may wait for the other ranks a little
  p.runtime->Submit(std::move(req), drive && small);
  return handle;
}

TensorSpec Spec(const InArray& a, const std::vector<int>& dtype_codes, std::size_t i) {
  TensorSpec spec;
  // An explicit code covers dtypes a producer cannot export (NumPy's bfloat16).
  spec.dtype = i < dtype_codes.size() && dtype_codes[i] >= 0 ? static_cast<DType>(dtype_codes[i])
                                                            : FromDlpack(a.dtype());
  for (std::size_t d = 0; d < a.ndim(); ++d) spec.shape.push_back(a.shape(d));
  return spec;
}

// Codes from Python are the exported enums' values (jaxcache.protocol); anything
// else is refused before a request exists.
template <typename E>
E Checked(int code, int count, const char* what) {
  if (code < 0 || code >= count)
    throw std::invalid_argument(std::string("jaxcache: unknown ") + what + " " + std::to_string(code));
  return static_cast<E>(code);
}

Submission FromArrays(int kind, const std::string& name, const std::vector<InArray>& inputs,
                      const std::vector<int>& dtype_codes, bool refuse_if_in_flight, int device,
                      int32_t process_set, int64_t world_size) {
  Submission s;
  s.name = name;
  s.process_set = process_set;
  s.world_size = world_size;
  s.sig.kind = Checked<Kind>(kind, kNumKinds, "collective kind");
  // The buffers are host memory (a bridge staged device tensors already);
  // the device kind only has to agree across ranks.
  s.sig.device = Checked<Device>(device, kNumDevices, "device kind");
  s.refuse_if_in_flight = refuse_if_in_flight;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    s.sig.tensors.push_back(Spec(inputs[i], dtype_codes, i));
    s.inputs.push_back(inputs[i].data());
  }
  return s;
}

// An allgather or alltoall whose outputs the executor allocates once the ranks
// have agreed on their sizes; read them with Handle.results().
std::shared_ptr<Handle> SubmitAllocated(int kind, const std::string& name, std::vector<InArray> inputs,
                                        std::vector<int64_t> splits, std::vector<int> dtype_codes,
                                        bool refuse_if_in_flight, int device, int32_t process_set,
                                        int64_t world_size, bool drive) {
  Submission s = FromArrays(kind, name, inputs, dtype_codes, refuse_if_in_flight, device,
                            process_set, world_size);
  s.sig.splits = std::move(splits);
  s.allocate_outputs = true;
  return Track(std::move(s), false, drive);
}

// The executor's outputs as (bytes, shape) pairs; the arrays keep them alive.
nb::list Results(Handle& h) {
  nb::list out;
  if (!h.store) return out;
  for (auto& b : h.store->buffers) {
    auto* keep = new std::shared_ptr<OutputStore>(h.store);
    nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<OutputStore>*>(p); });
    std::size_t shape[1] = {b.bytes};
    nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> bytes(b.data.get(), 1, shape, owner);
    out.append(nb::make_tuple(bytes, nb::cast(b.shape)));
  }
  return out;
}

std::shared_ptr<Handle> SubmitArrays(int kind, const std::string& name,
                                     std::vector<InArray> inputs, std::vector<OutArray> outputs,
                                     int op, double prescale, double postscale, int root,
                                     std::vector<int> dtype_codes, bool refuse_if_in_flight,
                                     int device, int32_t process_set, int64_t world_size,
                                     bool drive) {
  Submission s = FromArrays(kind, name, inputs, dtype_codes, refuse_if_in_flight, device,
                            process_set, world_size);
  s.sig.op = Checked<ReduceOp>(op, kNumReduceOps, "reduce op");
  s.sig.prescale = prescale;
  s.sig.postscale = postscale;
  s.sig.root = root;
  // Caller-sized outputs: the ranks must agree on equal shapes (blocks).
  s.sig.static_shapes = CollectiveOf(s.sig.kind).AgreedSizes();
  for (auto& o : outputs) {
    s.outputs.push_back(o.data());
    s.output_bytes.push_back(o.size() * o.itemsize());
  }
  return Track(std::move(s), false, drive);
}

template <typename T>
nb::capsule Capsule(T* fn) {
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jaxcache_ext, m) {
  m.doc() = "jaxcache C++ runtime";
  BindProtocol(m);
  // Handles held by module globals (or in flight at exit) outlive nanobind's
  // shutdown check; that is expected, not a reference-counting bug.
  nb::set_leak_warnings(false);
  main_thread_ident = nb::cast<unsigned long>(
      nb::module_::import_("threading").attr("main_thread")().attr("ident"));
  m.def("waiters", [] { return waiters.load(); });
  m.def("advise_heap_huge_pages", &AdviseHeapHugePages, nb::arg("reserve"));

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
