#include "join_state.h"

#include <cstring>

#include "reduce_ops.h"

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
  auto error = [&](const std::string& why) {
    return Status::Error(ErrorKind::kInvalidArgument,
                         "jaxcache: " + std::string(KindName(sig.kind)) + " '" + name + "' " + why);
  };
  std::string ranks;
  for (int r = 0; r < size_; ++r)
    if (joined_[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  const std::string who = (count_ == 1 ? "rank " : "ranks ") + ranks + (count_ == 1 ? " has" : " have");
  switch (sig.kind) {
    case Kind::kBroadcast:
      if (joined_[sig.root])
        return error("cannot run: its root, rank " + std::to_string(sig.root) +
                     ", has joined (called join()) and has no data to send");
      return Status::Ok();
    case Kind::kAlltoall:
      return error("cannot run while " + who + " joined: the rows sent to a joined rank would be lost");
    case Kind::kAllgather:
      if (agreement && agreement->static_shapes)
        return error("cannot run while " + who +
                     " joined: its result is sized for every rank's rows (under jit, or with "
                     "preallocated outputs) but joined ranks contribute none; gather eagerly");
      return Status::Ok();
    // A joined rank contributes the identity (allreduce, reducescatter) or
    // nothing to wait for (barrier, join).
    case Kind::kAllreduce:
    case Kind::kReducescatter:
    case Kind::kBarrier:
    case Kind::kJoin:
      return Status::Ok();
  }
  return Status::Ok();
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
  Request& req = *s.request;
  req.name = name;
  req.sig = sig;
  for (const TensorSpec& t : sig.tensors) {
    const std::size_t bytes = t.NumBytes();
    switch (sig.kind) {
      case Kind::kAllreduce:
      case Kind::kBroadcast: {  // in place: the identity in, scratch out
        s.buffers.push_back(OutputStore::Allocate(bytes, t.shape));
        char* p = s.buffers.back().data.get();
        if (sig.kind == Kind::kAllreduce) FillIdentity(p, t.NumElements(), t.dtype, sig.op);
        req.inputs.push_back(p);
        req.outputs.push_back(p);
        break;
      }
      case Kind::kReducescatter: {
        s.buffers.push_back(OutputStore::Allocate(bytes, t.shape));
        char* in = s.buffers.back().data.get();
        FillIdentity(in, t.NumElements(), t.dtype, sig.op);
        s.buffers.push_back(
            OutputStore::Allocate(ScatterRows(t.Rows(), size_, rank_) * t.RowBytes(), {}));
        req.inputs.push_back(in);
        req.outputs.push_back(s.buffers.back().data.get());
        break;
      }
      case Kind::kAllgather:  // no rows in, the executor allocates the output
        req.inputs.push_back(nullptr);
        req.outputs.push_back(nullptr);
        break;
      // Refused while ranks have joined (CheckJoined), or tensorless.
      case Kind::kAlltoall:
      case Kind::kBarrier:
      case Kind::kJoin:
        req.inputs.push_back(nullptr);
        req.outputs.push_back(nullptr);
        break;
    }
  }
  if (sig.kind == Kind::kAllgather) req.store = std::make_shared<OutputStore>();
  Request* raw = s.request.get();
  stand_ins_.push_back(std::move(s));
  return raw;
}

}  // namespace jaxcache
