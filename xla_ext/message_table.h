// Rank 0's view of uncached requests: which ranks have submitted each name,
// with what signature. A name is decided once every rank has submitted it:
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
  std::optional<Response> Add(int rank, const std::string& name, const Signature& sig);
  // Names still waiting, with the ranks that have submitted them.
  std::map<std::string, std::vector<int>> Waiting() const;
  void Clear() { entries_.clear(); }

  // Consistency check of all ranks' signatures (exposed for tests/bridges).
  static Status Check(const std::string& name, const std::vector<Signature>& sigs, int size);

 private:
  struct Entry {
    std::vector<std::optional<Signature>> by_rank;
    int count = 0;
  };
  int size_;
  std::map<std::string, Entry> entries_;
};

}  // namespace jaxcache
