// join(): a rank that has run out of data keeps serving the other ranks'
// collectives until every rank has joined (docs/control_plane.md#join).
//
// A rank counts as joined once its join() request has reached the controller
// and nothing else is pending on it. Each cycle every rank learns the same
// joined set: the bitvector carries a "some rank has joined" flag, and only
// when it is raised one extra OR-allreduce of a mask of joined ranks follows.
// While some rank is joined:
//  - a joined rank sets the bit of every cached entry (its bits count as
//    ready), and rank 0 decides uncached submissions once every rank that has
//    not joined has submitted them;
//  - a joined rank takes part in each decided collective through a stand-in
//    request: the reduction's identity in (zeros for a sum), no rows for an
//    allgather, scratch outputs; the stand-in counts as its submission of that
//    name, so submission numbers stay aligned with the other ranks';
//  - "average" divides by the ranks that have not joined; a broadcast from a
//    joined root, an alltoall, and an allgather whose outputs are sized for
//    equal shapes fail on every rank.
// When every rank has joined, every join() completes in the same cycle and
// returns the rank that joined last.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collective.h"
#include "request.h"

namespace jaxcache {

class JoinState {
 public:
  JoinState(int rank, int size) : rank_(rank), size_(size), joined_(size, false) {}

  void Add(Request* join_request) { request_ = join_request; }
  bool requested() const { return request_ != nullptr; }
  Request* request() const { return request_; }
  // Whether this rank counts as joined this cycle.
  bool JoinedHere(bool other_pending) const { return request_ && !other_pending; }

  // This rank's word mask for the joined-set OR-allreduce.
  std::vector<uint64_t> Mask(bool joined_here) const;
  // The agreed joined set of this cycle (null: the flag said nobody joined).
  void Update(const uint64_t* mask);
  bool any() const { return count_ > 0; }
  bool all() const { return count_ == size_; }
  bool grew() const { return grew_; }
  int count() const { return count_; }
  const std::vector<bool>& joined() const { return joined_; }

  // When every rank has joined: writes the rank that joined last into this
  // rank's request, forgets the joined set, and returns the request.
  Request* Finish();

  // What deciding `sig` means while ranks are joined: an error (the same on
  // every rank) for the collectives that cannot run without them.
  Status Conflict(const std::string& name, const Signature& sig, const Agreement* agreement) const;
  // `agreement` with the joined ranks' rows set to 0.
  std::shared_ptr<const Agreement> WithoutJoined(const std::shared_ptr<const Agreement>& agreement) const;

  // A request standing in for this joined rank in a collective it did not
  // submit; valid until ReleaseStandIns().
  Request* StandIn(const std::string& name, const Signature& sig);
  // Called when the previous cycle's work has been executed.
  void ReleaseStandIns() { stand_ins_.clear(); }
  // Forgets this rank's request and the joined set (a cancel round: every
  // rank at the same point of the protocol).
  void Reset();

 private:
  int rank_, size_;
  Request* request_ = nullptr;
  std::vector<bool> joined_, previous_;
  int count_ = 0;
  bool grew_ = false;
  int32_t last_ = -1;
  std::vector<StandInRequest> stand_ins_;
};

}  // namespace jaxcache
