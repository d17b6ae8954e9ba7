#include "message_table.h"

#include "collectives/collective.h"

namespace jaxcache {

Response MessageTable::Decide(const std::string& name, uint64_t seq,
                              const std::vector<const Signature*>& by_rank) {
  Checker c(name, by_rank);
  Response resp{name, seq, Status::Ok(), c.first(), nullptr};
  auto decide = [&]() -> Status {
    JAXCACHE_RETURN_IF_ERROR(c.Same("kind", [](const Signature& s) { return std::string(KindName(s.kind)); }));
    JAXCACHE_RETURN_IF_ERROR(c.Same("device", [](const Signature& s) { return std::string(DeviceName(s.device)); }));
    JAXCACHE_RETURN_IF_ERROR(c.Same("devices per process", [](const Signature& s) {
      return std::to_string(s.devices);
    }));
    JAXCACHE_RETURN_IF_ERROR(c.Same("reduction over the devices (axis_name)", [](const Signature& s) {
      return std::string(s.over_devices ? "yes" : "no");
    }));
    JAXCACHE_RETURN_IF_ERROR(c.Same("number of tensors", [](const Signature& s) {
      return std::to_string(s.tensors.size());
    }));
    const Collective& collective = CollectiveOf(c.first().kind);
    if (!collective.AgreedSizes()) return collective.Decide(c, nullptr);
    auto agreement = std::make_shared<Agreement>();
    Status st = collective.Decide(c, agreement.get());
    resp.agreement = std::move(agreement);
    return st;
  };
  resp.status = decide();
  if (!resp.status.ok()) resp.agreement = nullptr;
  return resp;
}

bool MessageTable::Complete(const Entry& e) const {
  for (int r = 0; r < size_; ++r)
    if (!e.by_rank[r] && !joined_[r]) return false;
  return true;
}

Response MessageTable::Take(std::map<std::pair<std::string, uint64_t>, Entry>::iterator it) {
  std::vector<const Signature*> by_rank(size_, nullptr);
  for (int r = 0; r < size_; ++r)
    if (it->second.by_rank[r]) by_rank[r] = &*it->second.by_rank[r];
  Response resp = Decide(it->first.first, it->first.second, by_rank);
  entries_.erase(it);
  return resp;
}

std::optional<Response> MessageTable::Add(int rank, const std::string& name, uint64_t seq,
                                          const Signature& sig) {
  auto it = entries_.try_emplace(std::make_pair(name, seq)).first;
  Entry& e = it->second;
  if (e.by_rank.empty()) e.by_rank.resize(size_);
  e.by_rank[rank] = sig;
  if (!Complete(e)) return std::nullopt;
  return Take(it);
}

std::vector<Response> MessageTable::SetJoined(const std::vector<bool>& joined) {
  bool grew = false;
  for (int r = 0; r < size_; ++r) grew |= joined[r] && !joined_[r];
  joined_ = joined;
  std::vector<Response> decided;
  if (!grew) return decided;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (Complete(it->second)) decided.push_back(Take(it));
    it = next;
  }
  return decided;
}

}  // namespace jaxcache
