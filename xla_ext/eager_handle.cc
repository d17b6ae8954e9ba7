#include "eager_handle.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace jaxcache {

namespace {

std::atomic<int> waiters{0};
unsigned long main_thread_ident = 0;

}  // namespace

int EagerWaiters() { return waiters.load(); }
void SetMainThread(unsigned long ident) { main_thread_ident = ident; }

// The main thread waits in slices and runs Python's signal handlers between
// them, so Ctrl-C raises KeyboardInterrupt within a
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

std::shared_ptr<Handle> Track(Submission s, bool join_value, bool drive) {
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

}  // namespace jaxcache
