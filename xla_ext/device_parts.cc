#include "device_parts.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

namespace jaxcache {

DeviceRendezvous& DeviceRendezvous::Get() {
  // Never destroyed: XLA threads may still arrive while the process exits.
  static auto* rendezvous = new DeviceRendezvous();
  return *rendezvous;
}

std::vector<DevicePart> DeviceRendezvous::Arrive(const void* site, int64_t run, int devices, DevicePart part,
                                                 StallLimits limits) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(site, run);
  std::deque<Set>& queue = sets_[key];
  const bool placed = part.position >= 0 && part.position < devices;
  // The oldest set still missing this position: a device's later execution of
  // the same instruction (a loop) belongs to a later set. A part without a
  // valid position fails the oldest set, in its first free place.
  auto set = std::find_if(queue.begin(), queue.end(), [&](const Set& s) { return !placed || !s.parts[part.position]; });
  if (set == queue.end()) {
    set = queue.emplace(queue.end());
    set->parts.resize(devices);
    set->limits = limits;
    waiting_cv_.notify_all();
  }
  if (!placed && part.status.ok())
    part.status = Status::Error(ErrorKind::kInternal, "jaxcache: '" + part.submission.name + "' ran on device position " +
                                                          std::to_string(part.position) + ", outside the program's " +
                                                          std::to_string(devices) + " devices");
  const auto free = std::find_if(set->parts.begin(), set->parts.end(), [](const auto& p) { return !p.has_value(); });
  auto& place = placed ? set->parts[part.position] : *free;
  place = std::move(part);
  if (++set->count < devices) return {};
  std::vector<DevicePart> complete;
  complete.reserve(devices);
  for (auto& p : set->parts) complete.push_back(std::move(*p));
  queue.erase(set);
  if (queue.empty()) sets_.erase(key);
  return complete;
}

std::string DeviceRendezvous::Missing(const std::string& name, const Set& set) {
  std::vector<int> missing;
  for (std::size_t p = 0; p < set.parts.size(); ++p)
    if (!set.parts[p]) missing.push_back(static_cast<int>(p));
  std::string where;
  for (int p : missing) where += (where.empty() ? "" : ", ") + std::to_string(p);
  return "'" + name + "' waits for device position" + (missing.size() > 1 ? "s " : " ") + where + " of " +
         std::to_string(set.parts.size()) +
         ": every device of a program must run each of its collectives (a condition that differs per "
         "device skips it on some)";
}

std::vector<std::string> DeviceRendezvous::Inspect(Clock::time_point now, std::vector<DevicePart>* expired) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> warnings;
  for (auto it = sets_.begin(); it != sets_.end();) {
    std::deque<Set>& queue = it->second;
    for (auto s = queue.begin(); s != queue.end();) {
      const double waited = std::chrono::duration<double>(now - s->since).count();
      std::string name;
      for (const auto& p : s->parts)
        if (p) name = p->submission.name;
      if (s->limits.shutdown_s > 0 && waited >= s->limits.shutdown_s) {
        const Status st = Status::Error(ErrorKind::kStall, s->limits.who + "jaxcache: " + Missing(name, *s) + " (waited " +
                                                               std::to_string(static_cast<int>(waited)) + " s)");
        for (auto& p : s->parts)
          if (p) {
            p->status = st;
            expired->push_back(std::move(*p));
          }
        s = queue.erase(s);
        continue;
      }
      if (!s->warned && s->limits.check_s > 0 && waited >= s->limits.check_s) {
        s->warned = true;
        warnings.push_back(s->limits.who + "jaxcache: " + Missing(name, *s) + " (waited " +
                           std::to_string(static_cast<int>(waited)) + " s)");
      }
      ++s;
    }
    it = queue.empty() ? sets_.erase(it) : std::next(it);
  }
  return warnings;
}

std::vector<DevicePart> DeviceRendezvous::TakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<DevicePart> parts;
  for (auto& [key, queue] : sets_)
    for (Set& set : queue)
      for (auto& p : set.parts)
        if (p) parts.push_back(std::move(*p));
  sets_.clear();
  return parts;
}

void DeviceRendezvous::AwaitWaiting(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  waiting_cv_.wait_for(lock, timeout, [&] { return !sets_.empty(); });
}

std::size_t DeviceRendezvous::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const auto& [key, queue] : sets_) n += queue.size();
  return n;
}

DeviceThreads& DeviceThreads::Get() {
  // Never destroyed, its threads never joined: one may be inside XLA at exit.
  static auto* threads = new DeviceThreads();
  return *threads;
}

void DeviceThreads::Post(int position, std::function<void()> fn) {
  Worker* w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (static_cast<int>(workers_.size()) <= position) {
      workers_.push_back(std::make_unique<Worker>());
      std::thread(&DeviceThreads::Loop, workers_.back().get()).detach();
    }
    w = workers_[position].get();
  }
  std::lock_guard<std::mutex> lock(w->mu);
  w->queue.push_back(std::move(fn));
  w->cv.notify_one();
}

void DeviceThreads::Loop(Worker* w) {
  NameThisThread("jaxcache-device");
  std::unique_lock<std::mutex> lock(w->mu);
  for (;;) {
    w->busy = false;
    w->idle.notify_all();
    w->cv.wait(lock, [&] { return !w->queue.empty(); });
    std::function<void()> fn = std::move(w->queue.front());
    w->queue.pop_front();
    w->busy = true;
    lock.unlock();
    fn();
    lock.lock();
  }
}

bool DeviceThreads::Drain(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<Worker*> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : workers_) workers.push_back(w.get());
  }
  for (Worker* w : workers) {
    std::unique_lock<std::mutex> lock(w->mu);
    if (!w->idle.wait_until(lock, deadline, [&] { return !w->busy && w->queue.empty(); })) return false;
  }
  return true;
}

namespace {

// The first failed part's status, naming its device position.
Status FirstFailure(const std::vector<DevicePart>& parts) {
  for (const auto& p : parts)
    if (!p.status.ok())
      return Status::Error(p.status.kind, p.status.message + " (device position " + std::to_string(p.position) +
                                              " of " + std::to_string(parts.size()) + ")");
  return Status::Ok();
}

}  // namespace

Completion CompletionOfAll(std::vector<DevicePart>& parts) {
  auto dones = std::make_shared<std::vector<Completion>>();
  bool cheap = true;
  for (auto& p : parts) {
    cheap = cheap && p.done.cheap();
    dones->push_back(std::move(p.done));
  }
  return Completion(
      [dones](const Status& st) {
        for (auto& d : *dones) d.Run(st);
      },
      cheap);
}

Status JoinParts(std::vector<DevicePart>& parts, Submission& joined) {
  Status failed = FirstFailure(parts);
  if (!failed.ok()) return failed;
  joined = std::move(parts.front().submission);
  joined.sig.devices = static_cast<int32_t>(parts.size());
  for (std::size_t i = 1; i < parts.size(); ++i) {
    Submission& s = parts[i].submission;
    for (std::size_t t = 0; t < s.sig.tensors.size(); ++t) {
      joined.sig.tensors.push_back(std::move(s.sig.tensors[t]));
      joined.inputs.push_back(s.inputs[t]);
      joined.outputs.push_back(s.outputs[t]);
      joined.output_bytes.push_back(s.output_bytes[t]);
    }
  }
  return Status::Ok();
}

}  // namespace jaxcache
