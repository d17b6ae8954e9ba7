// Chrome-trace / Perfetto timeline written by rank 0 (JAXCACHE_TIMELINE, or
// started and stopped while the runtime runs).
// Each collective gets its own track; phases are begin/end pairs. The file is
// valid JSON after every event: each event is written, together with the
// closing bracket, by one pwrite() over the previous closing bracket.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace jaxcache {

class Timeline {
 public:
  Timeline() : state_(std::make_shared<State>()) {}
  // A view that writes into the same file with every tensor name prefixed
  // (a process set's collectives: names are only unique within a set).
  Timeline Scoped(const std::string& prefix) const { return Timeline(state_, prefix); }
  // Starts writing to `path` (truncated), closing a file already open; safe
  // while other threads record events. False if the file cannot be created.
  bool Open(const std::string& path, bool mark_cycles);
  // Stops writing; the file stays a complete JSON array.
  void Close();
  bool enabled() const { return Live(); }

  void Begin(const std::string& tensor, const char* phase, const std::string& args = "");
  void End(const std::string& tensor, const char* phase);
  void Instant(const std::string& tensor, const std::string& what);
  void Cycle(int64_t number);
  // NEGOTIATE opens when rank 0 first hears of a name (its own request or
  // another rank's) and closes when the name is decided.
  void NegotiateBegin(const std::string& tensor, const char* path);
  void NegotiateEnd(const std::string& tensor);

 private:
  struct State {
    ~State();
    std::mutex mu;
    // Read without the lock as the fast "off" test; changed only under `mu`.
    std::atomic<int> fd{-1};
    bool mark_cycles = false;
    bool first = true;
    long long end_offset = 0;
    std::unordered_map<std::string, int> tracks;
    std::unordered_map<std::string, bool> negotiating;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  };
  Timeline(std::shared_ptr<State> state, std::string prefix)
      : state_(std::move(state)), prefix_(std::move(prefix)) {}
  bool Live() const { return state_->fd.load(std::memory_order_relaxed) >= 0; }
  int Track(const std::string& tensor);
  void Write(const std::string& event);
  int64_t Now() const;

  std::shared_ptr<State> state_;
  std::string prefix_;
};

}  // namespace jaxcache
