// Rank 0's view of uncached requests: which ranks have submitted each
// (name, submission number), with what signature. A submission is decided
// once every rank has submitted it or has joined (join_state.h): an OK
// response when the signatures agree -- with the Agreement (per-rank rows of
// allgather and alltoall) -- else an error naming the field, the values and
// the ranks.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "request.h"

namespace jaxcache {

class MessageTable {
 public:
  explicit MessageTable(int size) : size_(size), joined_(size, false) {}
  // Records rank `rank`'s request; returns a decided response when `name`
  // is now complete.
  std::optional<Response> Add(int rank, const std::string& name, uint64_t seq,
                              const Signature& sig);
  // The ranks that have joined count as having submitted every collective;
  // returns the submissions that this completes (in (name, seq) order).
  std::vector<Response> SetJoined(const std::vector<bool>& joined);
  void Clear() { entries_.clear(); }

  // The decision for one submission: by_rank[r] is rank r's signature, or
  // null for a rank that has joined (at least one is not null).
  static Response Decide(const std::string& name, uint64_t seq,
                         const std::vector<const Signature*>& by_rank);

 private:
  struct Entry {
    std::vector<std::optional<Signature>> by_rank;
  };
  bool Complete(const Entry& e) const;
  Response Take(std::map<std::pair<std::string, uint64_t>, Entry>::iterator it);

  int size_;
  std::vector<bool> joined_;
  std::map<std::pair<std::string, uint64_t>, Entry> entries_;
};

}  // namespace jaxcache
