#include "stall_inspector.h"

#include <map>
#include <set>
#include <sstream>

namespace jaxcache {

namespace {
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

bool StallInspector::WantsReport(Clock::time_point oldest, Clock::time_point now) const {
  if (config_.stall_check_s <= 0) return false;
  return Seconds(now - oldest) > config_.stall_check_s &&
         Seconds(now - last_report_) > config_.stall_check_s;
}

bool StallInspector::WantsShutdown(Clock::time_point oldest, Clock::time_point now) const {
  return config_.stall_shutdown_s > 0 && Seconds(now - oldest) > config_.stall_shutdown_s;
}

std::string StallInspector::Report(const std::vector<std::vector<std::string>>& pending_by_rank,
                                   double threshold_s, bool shutting_down) {
  int size = static_cast<int>(pending_by_rank.size());
  std::map<std::string, std::set<int>> have;
  for (int r = 0; r < size; ++r)
    for (const auto& name : pending_by_rank[r]) have[name].insert(r);
  std::ostringstream out;
  out << "jaxcache: stalled collectives: ranks have waited more than " << threshold_s
      << " s for other ranks to submit: ";
  int shown = 0, stalled = 0;
  for (const auto& [name, ranks] : have) {
    if (static_cast<int>(ranks.size()) == size) continue;  // ready everywhere: not stalled
    ++stalled;
    if (shown == 5) continue;
    std::vector<int> ready(ranks.begin(), ranks.end()), missing;
    for (int r = 0; r < size; ++r)
      if (!ranks.count(r)) missing.push_back(r);
    out << (shown ? "; " : "") << "'" << name << "' (submitted by " << RankList(ready)
        << ", missing on " << RankList(missing) << ")";
    ++shown;
  }
  if (stalled == 0) out << "(none missing: the ranks are slow, not stuck)";
  if (stalled > shown) out << "; ... and " << (stalled - shown) << " more";
  out << ". Every rank must submit the same collectives.";
  if (shutting_down)
    out << " JAXCACHE_STALL_SHUTDOWN_TIME passed: all pending collectives fail.";
  else
    out << " Set JAXCACHE_STALL_SHUTDOWN_TIME to turn stalls into errors.";
  return out.str();
}

}  // namespace jaxcache
