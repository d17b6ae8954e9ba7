#include "fault_injection.h"

#include <sstream>
#include <stdexcept>

namespace jaxcache {

const char* FaultPointName(FaultPoint point) {
  switch (point) {
    case FaultPoint::kCoordinator: return "coordinator";
    case FaultPoint::kDecode: return "decode";
    case FaultPoint::kData: return "data";
    case FaultPoint::kComplete: return "complete";
  }
  return "unknown";
}

FaultInjector::FaultInjector(const std::string& spec, int rank) {
  std::stringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    auto bad = [&](const char* why) {
      return std::invalid_argument("JAXCACHE_FAULT_INJECT: entry '" + item + "': " + why +
                                   " (expected point@rank[:name], point one of coordinator, "
                                   "decode, data, complete)");
    };
    auto at = item.find('@');
    if (at == std::string::npos) throw bad("missing '@rank'");
    std::string point_name = item.substr(0, at), rest = item.substr(at + 1), name;
    auto colon = rest.find(':');
    if (colon != std::string::npos) {
      name = rest.substr(colon + 1);
      rest = rest.substr(0, colon);
    }
    int target;
    try {
      std::size_t used = 0;
      target = std::stoi(rest, &used);
      if (used != rest.size()) throw std::invalid_argument("");
    } catch (const std::exception&) {
      throw bad("the rank is not an integer");
    }
    FaultPoint point;
    if (point_name == "coordinator") point = FaultPoint::kCoordinator;
    else if (point_name == "decode") point = FaultPoint::kDecode;
    else if (point_name == "data") point = FaultPoint::kData;
    else if (point_name == "complete") point = FaultPoint::kComplete;
    else throw bad("unknown point");
    if (target == rank) faults_.push_back({point, name});
  }
}

bool FaultInjector::Fire(FaultPoint point, const std::string& name) {
  if (faults_.empty()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  for (Fault& f : faults_) {
    if (f.fired || f.point != point || (!f.name.empty() && f.name != name)) continue;
    f.fired = true;
    return true;
  }
  return false;
}

}  // namespace jaxcache
