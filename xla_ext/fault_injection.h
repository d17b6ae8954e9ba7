// Test-only fault injection (JAXCACHE_FAULT_INJECT): makes a chosen step fail
// once on a chosen rank, so tests can prove that every failure path completes
// every pending request on every rank. Spec: comma-separated
// `point@rank[:name]`, point one of coordinator, decode, data, complete; the
// optional name restricts data and complete faults to that collective.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace jaxcache {

enum class FaultPoint { kCoordinator, kDecode, kData, kComplete };

class FaultInjector {
 public:
  // Throws std::invalid_argument naming the bad entry.
  FaultInjector(const std::string& spec, int rank);
  // True exactly once per armed entry matching (point, this rank, name).
  bool Fire(FaultPoint point, const std::string& name = "");
  bool armed() const { return !faults_.empty(); }

 private:
  struct Fault {
    FaultPoint point;
    std::string name;  // empty: any collective
    bool fired = false;
  };
  std::mutex mu_;
  std::vector<Fault> faults_;  // only this rank's
};

const char* FaultPointName(FaultPoint point);

}  // namespace jaxcache
