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

Timeline::State::~State() {
  if (fd >= 0) close(fd);
}

bool Timeline::Open(const std::string& path, bool mark_cycles) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  const char head[] = "[\n]";
  if (pwrite(fd, head, sizeof head - 1, 0) < 0) {
    close(fd);
    return false;
  }
  State& st = *state_;
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.fd >= 0) close(st.fd);
  st.mark_cycles = mark_cycles;
  st.first = true;
  st.end_offset = 2;  // position of the closing bracket
  st.tracks.clear();  // a new file declares its tracks anew
  st.negotiating.clear();
  st.start = std::chrono::steady_clock::now();
  st.fd = fd;
  return true;
}

void Timeline::Close() {
  State& st = *state_;
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.fd < 0) return;
  close(st.fd);
  st.fd = -1;
}

int64_t Timeline::Now() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               state_->start)
      .count();
}

void Timeline::Write(const std::string& event) {
  State& st = *state_;
  std::string text = (st.first ? "" : ",\n") + event + "\n]";
  if (pwrite(st.fd, text.data(), text.size(), st.end_offset) == static_cast<ssize_t>(text.size())) {
    st.end_offset += static_cast<long long>(text.size()) - 1;
    st.first = false;
  }
}

int Timeline::Track(const std::string& tensor) {
  std::string key = prefix_ + tensor;
  auto& tracks = state_->tracks;
  auto it = tracks.find(key);
  if (it != tracks.end()) return it->second;
  int id = static_cast<int>(tracks.size()) + 1;
  tracks[key] = id;
  Write("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(id) +
        ",\"args\":{\"name\":\"" + Escape(key) + "\"}}");
  Write("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(id) +
        ",\"args\":{\"sort_index\":" + std::to_string(id) + "}}");
  return id;
}

void Timeline::Begin(const std::string& tensor, const char* phase, const std::string& args) {
  if (!Live()) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!Live()) return;
  int pid = Track(tensor);
  Write("{\"name\":\"" + std::string(phase) + "\",\"ph\":\"B\",\"ts\":" + std::to_string(Now()) +
        ",\"pid\":" + std::to_string(pid) + ",\"tid\":1" +
        (args.empty() ? "" : ",\"args\":{" + args + "}") + "}");
}

void Timeline::End(const std::string& tensor, const char* phase) {
  if (!Live()) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!Live()) return;
  int pid = Track(tensor);
  Write("{\"name\":\"" + std::string(phase) + "\",\"ph\":\"E\",\"ts\":" + std::to_string(Now()) +
        ",\"pid\":" + std::to_string(pid) + ",\"tid\":1}");
}

void Timeline::Instant(const std::string& tensor, const std::string& what) {
  if (!Live()) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!Live()) return;
  int pid = Track(tensor);
  Write("{\"name\":\"" + Escape(what) + "\",\"ph\":\"i\",\"s\":\"t\",\"ts\":" +
        std::to_string(Now()) + ",\"pid\":" + std::to_string(pid) + ",\"tid\":1}");
}

void Timeline::NegotiateBegin(const std::string& tensor, const char* path) {
  if (!Live()) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    bool& open = state_->negotiating[prefix_ + tensor];
    if (open) return;
    open = true;
  }
  Begin(tensor, "NEGOTIATE", std::string("\"path\":\"") + path + "\"");
}

void Timeline::NegotiateEnd(const std::string& tensor) {
  if (!Live()) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->negotiating.find(prefix_ + tensor);
    if (it == state_->negotiating.end() || !it->second) return;
    it->second = false;
  }
  End(tensor, "NEGOTIATE");
}

void Timeline::Cycle(int64_t number) {
  if (!Live()) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!Live() || !state_->mark_cycles) return;
  Write("{\"name\":\"CYCLE " + std::to_string(number) + "\",\"ph\":\"i\",\"s\":\"g\",\"ts\":" +
        std::to_string(Now()) + ",\"pid\":0,\"tid\":0}");
}

}  // namespace jaxcache
