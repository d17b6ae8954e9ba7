// Rank 0's view of uncached requests: which ranks have submitted each
// (name, submission number), with what signature. A submission is decided
// once every rank has submitted it:
// an OK response when all signatures agree, else an error naming the field,
// the values and the ranks.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "request.h"

namespace jaxcache {

class MessageTable {
 public:
  explicit MessageTable(int size) : size_(size) {}
  // Records rank `rank`'s request; returns a decided response when `name`
  // is now complete.
  std::optional<Response> Add(int rank, const std::string& name, uint64_t seq,
                              const Signature& sig);
  void Clear() { entries_.clear(); }

  // Consistency check of all ranks' signatures (exposed for tests/bridges).
  static Status Check(const std::string& name, const std::vector<Signature>& sigs, int size);

 private:
  struct Entry {
    std::vector<std::optional<Signature>> by_rank;
    int count = 0;
  };
  int size_;
  std::map<std::pair<std::string, uint64_t>, Entry> entries_;
};

}  // namespace jaxcache
