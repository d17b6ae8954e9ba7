// Detects collectives that wait too long for other ranks. Each rank raises a
// flag in the cycle bitvector; rank 0 then gathers every rank's pending names
// and reports which ranks are missing which names.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config.h"
#include "request.h"

namespace jaxcache {

class StallInspector {
 public:
  explicit StallInspector(const Config& config) : config_(config) {}

  // `oldest` is the submission time of this rank's oldest pending request.
  bool WantsReport(Clock::time_point oldest, Clock::time_point now) const;
  bool WantsShutdown(Clock::time_point oldest, Clock::time_point now) const;
  void Reported(Clock::time_point now) { last_report_ = now; }

  // Builds rank 0's report from each rank's pending names.
  static std::string Report(const std::vector<std::vector<std::string>>& pending_by_rank,
                            double threshold_s, bool shutting_down);

 private:
  const Config& config_;
  Clock::time_point last_report_{};
};

}  // namespace jaxcache
