// The handle of an eagerly submitted request (eager JAX calls, the PyTorch and
// TensorFlow bridges): its completion, the interruptible wait, and the
// outputs the executor allocated.
#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "runtime.h"
#include "submission.h"

namespace jaxcache {

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
int EagerWaiters();
// Records the interpreter's main thread: only it runs Python's signal handlers.
void SetMainThread(unsigned long ident);

// Waits without the GIL; the main thread raises KeyboardInterrupt on Ctrl-C.
// Returns (status kind, message).
std::pair<int, std::string> WaitInterruptibly(Handle& h);

// Submits `s` with a handle for its outcome; a submission the runtime refuses
// gives a handle that has failed already (its wait() returns why).
// `drive`: the submitter drives small requests' cycles itself (a blocking call);
// otherwise (an async call) it returns at once and the first waiter drives.
std::shared_ptr<Handle> Track(Submission s, bool join_value = false, bool drive = true);

// The executor's outputs as (bytes, shape) pairs; the arrays keep them alive.
nanobind::list Results(Handle& h);

}  // namespace jaxcache
