#include "message_table.h"

#include <functional>
#include <sstream>

namespace jaxcache {

namespace {

// "rank 0: float32; ranks 1, 2: float64" -- ranks grouped by value.
std::string DescribeByRank(const std::vector<std::string>& values) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(values.size()); ++r) {
    auto it = groups.begin();
    for (; it != groups.end(); ++it)
      if (it->first == values[r]) break;
    if (it == groups.end()) groups.push_back({values[r], {r}});
    else it->second.push_back(r);
  }
  std::ostringstream out;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g) out << "; ";
    const auto& ranks = groups[g].second;
    out << (ranks.size() == 1 ? "rank " : "ranks ");
    for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
    out << ": " << groups[g].first;
  }
  return out.str();
}

std::string FormatDouble(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

}  // namespace

Status MessageTable::Check(const std::string& name, const std::vector<Signature>& sigs, int size) {
  auto mismatch = [&](const std::string& field,
                      const std::function<std::string(const Signature&)>& value) -> Status {
    std::vector<std::string> values;
    for (const auto& s : sigs) values.push_back(value(s));
    for (const auto& v : values)
      if (v != values[0])
        return Status::Error(ErrorKind::kMismatch,
                             "jaxcache: mismatched collective '" + name + "': " + field +
                                 " differs across ranks (" + DescribeByRank(values) + ")");
    return Status::Ok();
  };
  Status st;
  if (!(st = mismatch("kind", [](const Signature& s) { return std::string(KindName(s.kind)); })).ok()) return st;
  if (!(st = mismatch("device", [](const Signature& s) { return std::string(DeviceName(s.device)); })).ok()) return st;
  if (!(st = mismatch("number of tensors", [](const Signature& s) { return std::to_string(s.tensors.size()); })).ok()) return st;
  const Signature& first = sigs[0];
  if (first.kind == Kind::kAllreduce) {
    if (!(st = mismatch("reduce op", [](const Signature& s) { return std::string(ReduceOpName(s.op)); })).ok()) return st;
    if (!(st = mismatch("prescale", [](const Signature& s) { return FormatDouble(s.prescale); })).ok()) return st;
    if (!(st = mismatch("postscale", [](const Signature& s) { return FormatDouble(s.postscale); })).ok()) return st;
  }
  if (first.kind == Kind::kBroadcast) {
    if (!(st = mismatch("root", [](const Signature& s) { return std::to_string(s.root); })).ok()) return st;
    if (first.root < 0 || first.root >= size)
      return Status::Error(ErrorKind::kInvalidArgument,
                           "jaxcache: broadcast '" + name + "': root " + std::to_string(first.root) +
                               " is outside [0, " + std::to_string(size) + ")");
  }
  for (std::size_t i = 0; i < first.tensors.size(); ++i) {
    std::string which = first.tensors.size() == 1 ? "" : " of tensor " + std::to_string(i);
    if (!(st = mismatch("dtype" + which, [i](const Signature& s) { return std::string(DTypeName(s.tensors[i].dtype)); })).ok()) return st;
    if (!(st = mismatch("shape" + which, [i](const Signature& s) { return s.tensors[i].ShapeString(); })).ok()) return st;
  }
  return Status::Ok();
}

std::optional<Response> MessageTable::Add(int rank, const std::string& name, uint64_t seq,
                                          const Signature& sig) {
  const auto key = std::make_pair(name, seq);
  Entry& e = entries_[key];
  if (e.by_rank.empty()) e.by_rank.resize(size_);
  if (!e.by_rank[rank]) ++e.count;
  e.by_rank[rank] = sig;
  if (e.count < size_) return std::nullopt;
  std::vector<Signature> sigs;
  for (auto& s : e.by_rank) sigs.push_back(std::move(*s));
  entries_.erase(key);
  Response resp{name, seq, Check(name, sigs, size_), sigs[0]};
  return resp;
}

}  // namespace jaxcache
