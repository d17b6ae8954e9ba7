// Several devices per process. A program over N of this process's devices
// (shard_map, a sharded jax.Array, pmap) runs each collective N times: one
// execution of the custom call per device, concurrently and in any order.
// Those executions meet here, and leave as ONE request whose tensors are the
// devices' operands in device-position order. Tensor i of a group meets tensor
// i on every other process, so the device at position p of this process meets
// position p of every other one, whatever order XLA runs them in; and the
// negotiation, cache, fusion, stall inspection, timeline and errors treat the
// collective as one unit, its device count part of the signature.
//
// The executions of one collective in one run of a program are told apart from
// another run's by XLA's run id (shared by the devices of one execution), and
// from later executions of the same instruction in a loop by arrival order: a
// device cannot run an instruction again before its previous execution, which
// needs every device's part, has completed.
#pragma once

#include <cstdint>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "request.h"
#include "submission.h"  // Submission only: no runtime needed here

namespace jaxcache {

// One device's execution of a collective: what it submits, or why it cannot.
struct DevicePart {
  int position = 0;      // in the program's device order
  Submission submission; // this device's tensors only
  Status status;         // not ok: the part fails, and with it every part of its request
  Completion done;       // runs once the request holding the part completes
};

// How long a set may wait for its other devices: a warning after `check_s`,
// its parts failed (StallError) after `shutdown_s` when that is > 0 (the
// JAXCACHE_STALL_CHECK_TIME / _SHUTDOWN_TIME of the runtime it runs in). A
// device that never runs a collective its program's other devices run (a
// condition that differs per device) would otherwise hang them silently.
struct StallLimits {
  double check_s = 60;
  double shutdown_s = 0;
  std::string who;  // what starts a warning ("rank 3: ")
};

class DeviceRendezvous {
 public:
  // The process's rendezvous (one for every custom call of every program).
  static DeviceRendezvous& Get();
  // Adds `part` of execution `run` of the instruction `site`, which runs on
  // `devices` devices. Returns every part, in position order, when this one
  // completes the set; otherwise an empty vector (the parts wait here).
  // A part whose position is out of range or taken takes the first free place,
  // so that a set always completes (failed) rather than waiting forever.
  std::vector<DevicePart> Arrive(const void* site, int64_t run, int devices, DevicePart part,
                                 StallLimits limits = {});
  // Executions waiting for the rest of their devices.
  std::size_t waiting() const;
  // The sets waiting at `now`: a warning for each past its check time (once),
  // and the parts of each past its shutdown time, taken out into `expired`
  // with a StallError status (the caller completes them).
  std::vector<std::string> Inspect(Clock::time_point now, std::vector<DevicePart>* expired);
  // Blocks until some set waits, or `timeout` passes (the stall watch's sleep).
  void AwaitWaiting(std::chrono::milliseconds timeout);
  // Takes out every waiting part (the runtime shuts down: none can complete).
  std::vector<DevicePart> TakeAll();

 private:
  struct Set {
    std::vector<std::optional<DevicePart>> parts;
    int count = 0;
    Clock::time_point since = Clock::now();
    StallLimits limits;
    bool warned = false;
  };
  static std::string Missing(const std::string& name, const Set& set);
  mutable std::mutex mu_;
  std::condition_variable waiting_cv_;
  std::map<std::pair<const void*, int64_t>, std::deque<Set>> sets_;
};

// Runs each device position's completions on a thread of its own. XLA resumes
// a device's program on the thread that completes its custom call, and that
// program may go on into one of XLA's own collectives, which waits for the
// other devices: completed one after another on one thread, the first device
// would wait there for the others forever.
class DeviceThreads {
 public:
  static DeviceThreads& Get();
  // Runs `fn` on position `position`'s thread (started on first use).
  void Post(int position, std::function<void()> fn);
  // Waits until every thread is idle with nothing queued, at most `timeout`:
  // at shutdown, so that no program's continuation runs while the process
  // exits. Returns whether they are.
  bool Drain(std::chrono::milliseconds timeout);

 private:
  struct Worker {
    std::mutex mu;
    std::condition_variable cv, idle;
    std::deque<std::function<void()>> queue;
    bool busy = false;
  };
  static void Loop(Worker* w);
  std::mutex mu_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

// The submission of a complete set into `joined`: the parts' tensors in
// position order, one signature with `devices` = the number of parts. A failed
// part fails the set: its status is returned, naming its device position.
Status JoinParts(std::vector<DevicePart>& parts, Submission& joined);

// One completion for the set: each part's, in position order (moved out of `parts`).
Completion CompletionOfAll(std::vector<DevicePart>& parts);

}  // namespace jaxcache
