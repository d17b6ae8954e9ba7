// Bounded LRU cache of agreed responses, each owning one bit position of the
// cycle bitvector. Every rank applies the same operations in the same order
// (inserts in response-list order, touches in execution order), so the
// layout -- name to bit -- is identical on all ranks without communication.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "request.h"

namespace jaxcache {

class ResponseCache {
 public:
  explicit ResponseCache(std::size_t capacity) : capacity_(capacity), slots_(capacity) {}

  std::size_t capacity() const { return capacity_; }
  std::size_t size() const { return by_name_.size(); }

  enum class Lookup { kMiss, kHit, kInvalid };
  // kHit: same name and signature; kInvalid: same name, other signature.
  Lookup Find(const std::string& name, const Signature& sig, uint32_t* bit) const;

  // Inserts (or refreshes) an entry; returns its bit. `sig` is this rank's
  // signature (what its next submissions are compared with), `agreement` what
  // the ranks agreed with it. `evicted` receives the name of the entry whose
  // bit was reused, if any.
  uint32_t Insert(const std::string& name, const Signature& sig,
                  std::shared_ptr<const Agreement> agreement, std::optional<std::string>* evicted);
  void Erase(uint32_t bit);
  // Forgets every entry (every rank at the same point of the protocol).
  void Clear();
  void Touch(uint32_t bit);
  bool Occupied(uint32_t bit) const { return bit < capacity_ && slots_[bit].has_value(); }
  const std::string& NameAt(uint32_t bit) const { return slots_[bit]->name; }
  const Signature& SignatureAt(uint32_t bit) const { return slots_[bit]->sig; }
  const std::shared_ptr<const Agreement>& AgreementAt(uint32_t bit) const { return slots_[bit]->agreement; }
  std::unordered_map<std::string, uint32_t> Layout() const { return by_name_; }

 private:
  struct Entry {
    std::string name;
    Signature sig;
    std::shared_ptr<const Agreement> agreement;
    std::list<uint32_t>::iterator lru_pos;
  };
  std::size_t capacity_;
  std::vector<std::optional<Entry>> slots_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::list<uint32_t> lru_;  // front = most recently used
};

}  // namespace jaxcache
