#include "config.h"

namespace jaxcache {

std::map<std::string, std::variant<int64_t, double>> Stats::Snapshot() const {
  std::map<std::string, std::variant<int64_t, double>> out;
#define JAXCACHE_STAT_READ(name) out.emplace(#name, name.load());
  JAXCACHE_STAT_COUNTS(JAXCACHE_STAT_READ)
  JAXCACHE_STAT_SECONDS(JAXCACHE_STAT_READ)
#undef JAXCACHE_STAT_READ
  return out;
}

void Stats::Reset() {
#define JAXCACHE_STAT_ZERO(name) name.store(0);
  JAXCACHE_STAT_COUNTS(JAXCACHE_STAT_ZERO)
  JAXCACHE_STAT_SECONDS(JAXCACHE_STAT_ZERO)
#undef JAXCACHE_STAT_ZERO
}

}  // namespace jaxcache
