#include "response_cache.h"

namespace jaxcache {

ResponseCache::Lookup ResponseCache::Find(const std::string& name, const Signature& sig,
                                          uint32_t* bit) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return Lookup::kMiss;
  *bit = it->second;
  return slots_[it->second]->sig == sig ? Lookup::kHit : Lookup::kInvalid;
}

uint32_t ResponseCache::Insert(const std::string& name, const Signature& sig,
                               std::shared_ptr<const Agreement> agreement,
                               std::optional<std::string>* evicted) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {  // re-negotiated after invalidation on all ranks
    slots_[it->second]->sig = sig;
    slots_[it->second]->agreement = std::move(agreement);
    Touch(it->second);
    return it->second;
  }
  uint32_t bit;
  if (by_name_.size() < capacity_) {
    // Lowest free bit: deterministic, and keeps the bitvector dense.
    bit = 0;
    while (slots_[bit].has_value()) ++bit;
  } else {
    bit = lru_.back();
    *evicted = slots_[bit]->name;
    Erase(bit);
  }
  lru_.push_front(bit);
  slots_[bit] = Entry{name, sig, std::move(agreement), lru_.begin()};
  by_name_[name] = bit;
  return bit;
}

void ResponseCache::Erase(uint32_t bit) {
  if (!Occupied(bit)) return;
  lru_.erase(slots_[bit]->lru_pos);
  by_name_.erase(slots_[bit]->name);
  slots_[bit].reset();
}

void ResponseCache::Clear() {
  for (auto& slot : slots_) slot.reset();
  by_name_.clear();
  lru_.clear();
}

void ResponseCache::Touch(uint32_t bit) {
  if (!Occupied(bit)) return;
  lru_.splice(lru_.begin(), lru_, slots_[bit]->lru_pos);
}

}  // namespace jaxcache
