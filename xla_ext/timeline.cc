#include "timeline.h"

#include <fcntl.h>
#include <unistd.h>

namespace jaxcache {

namespace {
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) { out += ' '; continue; }
    out += c;
  }
  return out;
}
}  // namespace

Timeline::~Timeline() {
  if (fd_ >= 0) close(fd_);
}

bool Timeline::Open(const std::string& path, bool mark_cycles) {
  fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd_ < 0) return false;
  mark_cycles_ = mark_cycles;
  const char head[] = "[\n]";
  if (pwrite(fd_, head, sizeof head - 1, 0) < 0) return false;
  end_offset_ = 2;  // position of the closing bracket
  return true;
}

int64_t Timeline::Now() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start_)
      .count();
}

void Timeline::Write(const std::string& event) {
  std::string text = (first_ ? "" : ",\n") + event + "\n]";
  if (pwrite(fd_, text.data(), text.size(), end_offset_) == static_cast<ssize_t>(text.size())) {
    end_offset_ += static_cast<long long>(text.size()) - 1;
    first_ = false;
  }
}

int Timeline::Track(const std::string& tensor) {
  auto it = tracks_.find(tensor);
  if (it != tracks_.end()) return it->second;
  int id = static_cast<int>(tracks_.size()) + 1;
  tracks_[tensor] = id;
  Write("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(id) +
        ",\"args\":{\"name\":\"" + Escape(tensor) + "\"}}");
  Write("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(id) +
        ",\"args\":{\"sort_index\":" + std::to_string(id) + "}}");
  return id;
}

void Timeline::Begin(const std::string& tensor, const char* phase, const std::string& args) {
  if (fd_ < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  int pid = Track(tensor);
  Write("{\"name\":\"" + std::string(phase) + "\",\"ph\":\"B\",\"ts\":" + std::to_string(Now()) +
        ",\"pid\":" + std::to_string(pid) + ",\"tid\":1" +
        (args.empty() ? "" : ",\"args\":{" + args + "}") + "}");
}

void Timeline::End(const std::string& tensor, const char* phase) {
  if (fd_ < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  int pid = Track(tensor);
  Write("{\"name\":\"" + std::string(phase) + "\",\"ph\":\"E\",\"ts\":" + std::to_string(Now()) +
        ",\"pid\":" + std::to_string(pid) + ",\"tid\":1}");
}

void Timeline::Instant(const std::string& tensor, const std::string& what) {
  if (fd_ < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  int pid = Track(tensor);
  Write("{\"name\":\"" + Escape(what) + "\",\"ph\":\"i\",\"s\":\"t\",\"ts\":" +
        std::to_string(Now()) + ",\"pid\":" + std::to_string(pid) + ",\"tid\":1}");
}

void Timeline::NegotiateBegin(const std::string& tensor, const char* path) {
  if (fd_ < 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bool& open = negotiating_[tensor];
    if (open) return;
    open = true;
  }
  Begin(tensor, "NEGOTIATE", std::string("\"path\":\"") + path + "\"");
}

void Timeline::NegotiateEnd(const std::string& tensor) {
  if (fd_ < 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = negotiating_.find(tensor);
    if (it == negotiating_.end() || !it->second) return;
    it->second = false;
  }
  End(tensor, "NEGOTIATE");
}

void Timeline::Cycle(int64_t number) {
  if (fd_ < 0 || !mark_cycles_) return;
  std::lock_guard<std::mutex> lock(mu_);
  Write("{\"name\":\"CYCLE " + std::to_string(number) + "\",\"ph\":\"i\",\"s\":\"g\",\"ts\":" +
        std::to_string(Now()) + ",\"pid\":0,\"tid\":0}");
}

}  // namespace jaxcache
