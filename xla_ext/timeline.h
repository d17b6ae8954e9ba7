// Chrome-trace / Perfetto timeline written by rank 0 (JAXCACHE_TIMELINE).
// Each collective gets its own track; phases are begin/end pairs. The file is
// valid JSON after every event: each event is written, together with the
// closing bracket, by one pwrite() over the previous closing bracket.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>

namespace jaxcache {

class Timeline {
 public:
  Timeline() = default;
  ~Timeline();
  bool Open(const std::string& path, bool mark_cycles);
  bool enabled() const { return fd_ >= 0; }

  void Begin(const std::string& tensor, const char* phase, const std::string& args = "");
  void End(const std::string& tensor, const char* phase);
  void Instant(const std::string& tensor, const std::string& what);
  void Cycle(int64_t number);
  // NEGOTIATE opens when rank 0 first hears of a name (its own request or
  // another rank's) and closes when the name is decided.
  void NegotiateBegin(const std::string& tensor, const char* path);
  void NegotiateEnd(const std::string& tensor);

 private:
  int Track(const std::string& tensor);
  void Write(const std::string& event);
  int64_t Now() const;

  std::mutex mu_;
  int fd_ = -1;
  bool mark_cycles_ = false;
  bool first_ = true;
  long long end_offset_ = 0;
  std::unordered_map<std::string, int> tracks_;
  std::unordered_map<std::string, bool> negotiating_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace jaxcache
