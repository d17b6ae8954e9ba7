#include "join_state.h"

#include <cstring>

#include "collectives/collective.h"

namespace jaxcache {

std::vector<uint64_t> JoinState::Mask(bool joined_here) const {
  std::vector<uint64_t> mask((size_ + 63) / 64, 0);
  if (joined_here) mask[rank_ / 64] |= 1ull << (rank_ % 64);
  return mask;
}

void JoinState::Update(const uint64_t* mask) {
  previous_ = joined_;
  count_ = 0;
  grew_ = false;
  int32_t newest = -1;
  for (int r = 0; r < size_; ++r) {
    joined_[r] = mask && ((mask[r / 64] >> (r % 64)) & 1);
    count_ += joined_[r];
    if (joined_[r] && !previous_[r]) {
      grew_ = true;
      newest = r;  // of the ranks that joined in the same cycle, the highest
    }
  }
  if (newest >= 0) last_ = newest;
}

Request* JoinState::Finish() {
  Request* req = request_;
  if (!req->outputs.empty() && req->outputs[0]) std::memcpy(req->outputs[0], &last_, sizeof last_);
  Reset();
  return req;
}

void JoinState::Reset() {
  request_ = nullptr;
  std::fill(joined_.begin(), joined_.end(), false);
  std::fill(previous_.begin(), previous_.end(), false);
  count_ = 0;
  grew_ = false;
  last_ = -1;
}

Status JoinState::Conflict(const std::string& name, const Signature& sig,
                           const Agreement* agreement) const {
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r)
    if (joined_[r]) ranks.push_back(r);
  const std::string who = RankList(ranks) + (count_ == 1 ? " has" : " have");
  const std::string why = CollectiveOf(sig.kind).JoinConflict(sig, agreement, joined_, who);
  if (why.empty()) return Status::Ok();
  return Status::Error(ErrorKind::kInvalidArgument,
                       "jaxcache: " + std::string(KindName(sig.kind)) + " '" + name + "' " + why);
}

std::shared_ptr<const Agreement> JoinState::WithoutJoined(
    const std::shared_ptr<const Agreement>& agreement) const {
  if (!agreement || !any()) return agreement;
  auto copy = std::make_shared<Agreement>(*agreement);
  // allgather: rows[t * size + r]; a joined rank r contributes no rows.
  for (std::size_t i = 0; i < copy->rows.size(); ++i)
    if (joined_[i % size_]) copy->rows[i] = 0;
  return copy;
}

Request* JoinState::StandIn(const std::string& name, const Signature& sig) {
  StandInRequest s;
  s.request = std::make_unique<Request>();
  s.request->name = name;
  s.request->sig = sig;
  const Collective& collective = CollectiveOf(sig.kind);
  for (const TensorSpec& t : sig.tensors) collective.StandInTensor(sig, t, rank_, size_, s);
  if (collective.AgreedSizes()) s.request->store = std::make_shared<OutputStore>();
  Request* raw = s.request.get();
  stand_ins_.push_back(std::move(s));
  return raw;
}

}  // namespace jaxcache
