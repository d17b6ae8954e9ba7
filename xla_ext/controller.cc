#include "controller.h"

#include <cstdio>
#include <set>
#include <sstream>

namespace jaxcache {

namespace {
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
inline void SetBit(uint64_t* v, std::size_t b) { v[b / 64] |= 1ull << (b % 64); }
inline bool GetBit(const uint64_t* v, std::size_t b) { return (v[b / 64] >> (b % 64)) & 1; }


// A local failure inside a protocol step: recorded, never thrown past the
// step, so this rank still makes every MPI call its peers make.
struct InjectedFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};
}  // namespace

Controller::Controller(Comm& comm, const Config& config, Stats& stats, Timeline& timeline,
                       RequestTable& table, FaultInjector& faults, std::string scope)
    : comm_(comm),
      config_(config),
      stats_(stats),
      timeline_(timeline),
      table_(table),
      faults_(faults),
      scope_(std::move(scope)),
      cache_(static_cast<std::size_t>(config.cache_capacity)),
      messages_(comm.size()),
      join_(comm.rank(), comm.size()),
      stall_(config),
      combine_([this](char* mine, std::size_t mine_bytes, char* theirs, std::size_t theirs_bytes,
                      bool theirs_lower) {
        return message_.Combine(mine, mine_bytes, theirs, theirs_bytes, theirs_lower);
      }) {}

void Controller::Add(Request* req) {
  if (join_.requested()) {  // failed at the start of the next cycle
    rejected_.push_back(req);
    return;
  }
  if (req->sig.kind == Kind::kJoin) {
    join_.Add(req);
    return;
  }
  uint32_t bit = 0;
  auto found = cache_.capacity() ? cache_.Find(req->name, req->sig, &bit) : ResponseCache::Lookup::kMiss;
  const char* path = found != ResponseCache::Lookup::kHit ? "coordinator"
                     : message_.Eligible(bit)              ? "in-cycle"
                                                           : "cached";
  timeline_.NegotiateBegin(req->name, path);
  if (found == ResponseCache::Lookup::kHit) {
    cached_[bit] = req;
    return;
  }
  if (found == ResponseCache::Lookup::kInvalid) invalid_.push_back(bit);
  ++stats_.cache_misses;
  unsent_.push_back(req);
}

void Controller::ReportFault(const std::string& what) {
  std::lock_guard<std::mutex> lock(fault_mu_);
  if (fault_.empty()) fault_ = what;
}

void Controller::MoveToUncached(uint32_t bit) {
  auto it = cached_.find(bit);
  if (it == cached_.end()) return;
  ++stats_.cache_misses;
  unsent_.push_back(it->second);
  cached_.erase(it);
}

Clock::time_point Controller::OldestPending() const {
  Clock::time_point oldest = Clock::now();
  for (const auto& [bit, r] : cached_) oldest = std::min(oldest, r->submitted);
  for (const auto* r : unsent_) oldest = std::min(oldest, r->submitted);
  for (const auto& [name, r] : sent_) oldest = std::min(oldest, r->submitted);
  return oldest;
}

bool Controller::HasFault() {
  std::lock_guard<std::mutex> lock(fault_mu_);
  return !fault_.empty();
}

Task<CycleOutcome> Controller::Cycle(CycleIntent intent) {
  intent_ = intent;
  cycle_start_ = Clock::now();
  ++stats_.cycles;
  timeline_.Cycle(stats_.cycles);
  join_.ReleaseStandIns();  // the previous cycle's work has been executed
  CycleOutcome out;
  co_await ExchangeBits();
  co_await Settle(&out);
  stats_.AddNegotiation(Since(cycle_start_));
  co_return out;
}

// This rank's ready bits (and small cached data) and flags, combined with
// every rank's in the cycle's one allreduce; bits_ then holds the result.
Task<> Controller::ExchangeBits() {
  const std::size_t cap = cache_.capacity();
  bits_ = message_.Prepare((cap + kNumFlags + 63) / 64);
  for (const auto& [bit, req] : cached_) {  // ascending bits, as the message wants them
    SetBit(bits_, bit);
    if (message_.Eligible(bit)) message_.Put(bit, *req, comm_.size());
  }
  // A joined rank's bits count as ready: it takes part in whatever the others have ready.
  joined_here_ = join_.JoinedHere(OtherPending());
  if (joined_here_)
    for (uint32_t b = 0; b < cap; ++b)
      if (cache_.Occupied(b)) SetBit(bits_, b);
  PostFlags(cap);
  ++stats_.bitvector_syncs;
  co_await comm_.CycleAllreduce(message_.data(), message_.mutable_bytes(), message_.max_bytes(),
                                combine_);
  message_.Finish();
}

void Controller::PostFlags(std::size_t cap) {
  bool stall_report = false, stall_shutdown = false;
  if (HasPending() && cycle_start_ - last_stall_scan_ > std::chrono::milliseconds(200)) {
    last_stall_scan_ = cycle_start_;
    auto oldest = OldestPending();
    stall_report = stall_.WantsReport(oldest, cycle_start_);
    stall_shutdown = stall_.WantsShutdown(oldest, cycle_start_);
  }
  const bool local[kNumFlags] = {intent_.shutdown_requested, intent_.shutdown_forced,
                                 !unsent_.empty(),           !invalid_.empty(),
                                 stall_report,               stall_shutdown,
                                 HasFault(),                 joined_here_};
  for (int f = 0; f < kNumFlags; ++f)
    if (local[f] == (f == kShutdownRequested)) SetBit(bits_, cap + f);
}

bool Controller::SomeRank(Flag f) const { return !GetBit(bits_, cache_.capacity() + f); }
bool Controller::EveryRank(Flag f) const { return GetBit(bits_, cache_.capacity() + f); }

// What the combined bits decide, in the same order on every rank.
Task<> Controller::Settle(CycleOutcome* out) {
  if (SomeRank(kShutdownForced) || EveryRank(kShutdownRequested)) {
    co_await Shutdown(SomeRank(kShutdownForced), intent_.shutdown_requested, out);
    co_return;
  }
  if (SomeRank(kFault) || SomeRank(kStallShutdown)) {
    co_await CancelRound(SomeRank(kFault) ? CancelCause::kFault : CancelCause::kStall);
    out->progress = true;
    co_return;
  }
  FailRejected(out);  // after the cancel round, which fails them with everything else
  const bool all_joined = co_await SyncJoins(out);
  if (all_joined) co_return;
  if (SomeRank(kInvalid)) co_await SyncInvalidations();
  if (joined_here_) StandInForHits(out);
  TakeHits(out);
  // New joiners may complete submissions that rank 0 holds: it rescans them.
  bool completed = true;
  if (SomeRank(kUncached) || join_.grew()) completed = co_await CoordinatorRound(out, joined_here_);
  if (!completed) {
    // Some rank could not complete the round: nothing decided in this cycle
    // may run anywhere. The cancel round fails it all, on every rank alike.
    out->done.clear();
    out->work.clear();
    out->failed.clear();
    co_await CancelRound(CancelCause::kFault);
    out->progress = true;
    co_return;
  }
  if (SomeRank(kStallReport)) co_await StallReport();
  out->progress = !out->work.empty() || !out->failed.empty() || !out->done.empty();
}

void Controller::FailRejected(CycleOutcome* out) {
  for (Request* req : rejected_)
    out->failed.emplace_back(
        req, Status::Error(ErrorKind::kInvalidArgument,
                           "jaxcache: '" + req->name + "' was submitted on rank " +
                               std::to_string(comm_.rank()) +
                               " after its join(); a rank that has joined takes part in the other "
                               "ranks' collectives by itself until every rank has joined"));
  rejected_.clear();
}

// The ranks OR their joined masks when some rank has joined. True when every
// rank has: every join() completes now and the cycle ends.
Task<bool> Controller::SyncJoins(CycleOutcome* out) {
  if (SomeRank(kJoined)) {
    auto mask = join_.Mask(joined_here_);
    co_await comm_.Allreduce(mask.data(), static_cast<int>(mask.size()), MPI_BOR);
    join_.Update(mask.data());
  } else if (join_.any()) {
    join_.Update(nullptr);
  }
  if (!join_.all()) co_return false;
  // A rank joins only when nothing else is pending on it, so nothing is
  // pending anywhere and the bits are no hits.
  out->work.push_back(join_.Finish());
  out->progress = true;
  co_return true;
}

// Entries that some rank invalidated leave every rank's cache; their bits are no hits.
Task<> Controller::SyncInvalidations() {
  const std::size_t cap = cache_.capacity();
  std::vector<uint64_t> inv((cap + 63) / 64, 0);
  for (uint32_t b : invalid_) SetBit(inv.data(), b);
  invalid_.clear();
  co_await comm_.Allreduce(inv.data(), static_cast<int>(inv.size()), MPI_BOR);
  for (uint32_t b = 0; b < cap; ++b) {
    if (!GetBit(inv.data(), b)) continue;
    bits_[b / 64] &= ~(1ull << (b % 64));
    MoveToUncached(b);
    EraseFromCache(b);
    ++stats_.cache_invalidations;
  }
  PublishLayout();
}

// This joined rank: every surviving bit is a collective that the ranks still
// at work have ready; it takes part through a stand-in.
void Controller::StandInForHits(CycleOutcome* out) {
  for (uint32_t b = 0; b < cache_.capacity(); ++b) {
    if (!GetBit(bits_, b) || !cache_.Occupied(b)) continue;
    cache_.Touch(b);
    ++stats_.cache_hits;
    StandIn(cache_.NameAt(b), -1, cache_.SignatureAt(b), cache_.AgreementAt(b), out);
  }
}

// Common hits, ascending bit order: identical on every rank. A hit was reduced
// inside the cycle's allreduce when every rank put its data in (no rank joined).
void Controller::TakeHits(CycleOutcome* out) {
  for (auto it = cached_.begin(); it != cached_.end();) {
    if (!GetBit(bits_, it->first)) {
      ++it;
      continue;
    }
    const uint32_t bit = it->first;
    Request* req = it->second;
    cache_.Touch(bit);
    ++stats_.cache_hits;
    timeline_.NegotiateEnd(req->name);
    if (!join_.any() && message_.Take(bit, *req, comm_.size())) {
      ++stats_.in_cycle_reductions;
      stats_.bytes_reduced += req->sig.NumBytes();
      out->done.push_back(req);
    } else {
      Decide(req, cache_.AgreementAt(bit), out);
    }
    it = cached_.erase(it);
  }
}

void Controller::Decide(Request* req, const std::shared_ptr<const Agreement>& agreement,
                        CycleOutcome* out) {
  if (join_.any()) {
    Status conflict = join_.Conflict(req->name, req->sig, agreement.get());
    if (!conflict.ok()) {
      out->failed.emplace_back(req, conflict);
      return;
    }
    req->agreement = join_.WithoutJoined(agreement);
    req->contributors = comm_.size() - join_.count();
  } else {
    req->agreement = agreement;
    req->contributors = 0;
  }
  timeline_.Begin(req->name, "QUEUE");
  out->work.push_back(req);
}

void Controller::StandIn(const std::string& name, int64_t seq, const Signature& sig,
                         const std::shared_ptr<const Agreement>& agreement, CycleOutcome* out) {
  table_.CountStandIn(name, seq);
  // What the joined ranks make impossible fails on the other ranks; nothing runs.
  if (!join_.Conflict(name, sig, agreement.get()).ok()) return;
  Decide(join_.StandIn(name, sig), agreement, out);
}

std::vector<char> Controller::MatchRequests(const std::vector<std::vector<char>>& gathered) {
  if (faults_.Fire(FaultPoint::kDecode)) throw InjectedFault("decoding a request message (injected fault)");
  Writer rw;
  rw.U8(kDecided);
  for (const Response& resp : messages_.SetJoined(join_.joined())) WriteResponse(rw, resp);
  for (int r = 0; r < comm_.size(); ++r) {
    Reader rd(gathered[r].data(), gathered[r].size());
    while (!rd.done()) {
      RequestEntry e = ReadRequestEntry(rd);
      timeline_.NegotiateBegin(e.name, "coordinator");
      timeline_.Instant(e.name, "rank " + std::to_string(r) + " ready");
      if (auto resp = messages_.Add(r, e.name, e.seq, e.sig)) {
        if (!resp->status.ok()) resp->status.message += scope_;
        WriteResponse(rw, *resp);
      }
    }
  }
  return std::move(rw.buffer());
}

Task<bool> Controller::CoordinatorRound(CycleOutcome* out, bool joined_here) {
  ++stats_.coordinator_rounds;
  std::string fault;
  Writer w;
  for (Request* req : unsent_) {
    WriteRequestEntry(w, req->name, req->seq, req->sig);
    sent_[req->name] = req;
  }
  unsent_.clear();
  auto gathered = co_await comm_.GatherBytes(w.buffer());
  if (faults_.Fire(FaultPoint::kCoordinator)) fault = "the coordinator round (injected fault)";

  std::vector<char> response_bytes;
  if (comm_.rank() == 0) {
    try {
      response_bytes = MatchRequests(gathered);
    } catch (const std::exception& e) {
      if (fault.empty()) fault = e.what();
      response_bytes.assign(1, kUndecided);
    }
  }
  co_await comm_.BroadcastBytes(&response_bytes);

  // Decode without side effects; apply only once every rank has decoded.
  std::vector<Response> responses;
  if (fault.empty()) responses = DecodeResponses(response_bytes, &fault);
  int ok = fault.empty() ? 1 : 0;
  co_await comm_.AllreduceInt(&ok, MPI_MIN);  // the commit
  if (!fault.empty()) ReportFault("rank " + std::to_string(comm_.rank()) + ": " + fault);
  if (!ok) co_return false;
  ApplyResponses(responses, joined_here, out);
  co_return true;
}

std::vector<Response> Controller::DecodeResponses(const std::vector<char>& bytes, std::string* fault) {
  std::vector<Response> responses;
  try {
    if (comm_.rank() != 0 && faults_.Fire(FaultPoint::kDecode))
      throw InjectedFault("decoding the response message (injected fault)");
    Reader rd(bytes.data(), bytes.size());
    if (rd.U8() != kDecided) throw InjectedFault("rank 0 could not decide (see its error)");
    while (!rd.done()) responses.push_back(ReadResponse(rd));
  } catch (const std::exception& e) {
    *fault = e.what();
  }
  return responses;
}

// Every rank caches the same responses (its own signature where it has one)
// and decides, fails or stands in for each.
void Controller::ApplyResponses(std::vector<Response>& responses, bool joined_here, CycleOutcome* out) {
  bool cache_changed = false;
  for (Response& resp : responses) {
    Request* req = nullptr;
    auto it = sent_.find(resp.name);
    if (it != sent_.end() && it->second->seq == resp.seq) {
      req = it->second;
      sent_.erase(it);
    } else if (!joined_here) {
      continue;  // not decided without this rank's request
    }
    const bool runs = resp.status.ok() &&
                      (!join_.any() || join_.Conflict(resp.name, resp.sig, resp.agreement.get()).ok());
    if (runs && cache_.capacity()) {
      InsertIntoCache(resp.name, req ? req->sig : resp.sig, resp.agreement);
      cache_changed = true;
    }
    if (!req) {  // decided without this joined rank
      if (resp.status.ok()) StandIn(resp.name, static_cast<int64_t>(resp.seq), resp.sig, resp.agreement, out);
      else table_.CountStandIn(resp.name, static_cast<int64_t>(resp.seq));
      continue;
    }
    timeline_.NegotiateEnd(resp.name);
    if (!resp.status.ok()) {
      out->failed.emplace_back(req, resp.status);
      continue;
    }
    Decide(req, resp.agreement, out);
  }
  if (cache_changed) PublishLayout();
}

void Controller::EraseFromCache(uint32_t bit) {
  cache_.Erase(bit);
  message_.Release(bit);
}

void Controller::InsertIntoCache(const std::string& name, const Signature& sig,
                                 const std::shared_ptr<const Agreement>& agreement) {
  std::optional<std::string> evicted;
  uint32_t bit = cache_.Insert(name, sig, agreement, &evicted);
  message_.Assign(bit, sig);
  if (!evicted) return;
  ++stats_.cache_evictions;
  // A request of the evicted name that was waiting on this bit renegotiates.
  MoveToUncached(bit);
  if (!eviction_warned_ && comm_.rank() == 0) {
    std::fprintf(stderr,
                 "jaxcache: warning: the response cache is full (%zu entries) and evicts '%s'; a "
                 "training step with more distinct collective names than JAXCACHE_CACHE_CAPACITY "
                 "renegotiates every step. Raise JAXCACHE_CACHE_CAPACITY.\n",
                 cache_.capacity(), evicted->c_str());
  }
  eviction_warned_ = true;
}

Task<> Controller::Shutdown(bool forced, bool requested_here, CycleOutcome* out) {
  std::string message = "jaxcache: the runtime was shut down (shutdown() was called on every rank)";
  if (forced) {
    // Everyone learns which ranks never asked, so the message can say so.
    std::vector<int> requested(comm_.size(), 0);
    int mine = requested_here ? 1 : 0;
    co_await comm_.AllgatherInt(mine, requested.data());
    std::vector<int> missing;
    for (int r = 0; r < comm_.size(); ++r)
      if (!requested[r]) missing.push_back(r);
    out->never_asked = missing;
    message = "jaxcache: the runtime was shut down: " +
              (missing.empty() ? std::string("a rank stopped waiting for the others")
                               : RankList(missing) + " never called shutdown() within "
                                                     "JAXCACHE_SHUTDOWN_TIMEOUT") +
              "; collectives can no longer complete";
  }
  out->shutdown = true;
  out->shutdown_status = Status::Error(ErrorKind::kShutdown, message);
  FailAll(out->shutdown_status, out);
}

Task<> Controller::CancelRound(CancelCause cause) {
  ++stats_.cancellations;
  CancelReport mine;
  {
    std::lock_guard<std::mutex> lock(fault_mu_);
    mine.fault.swap(fault_);
  }
  mine.pending = table_.Pending();
  const std::vector<char> report = EncodeCancelReport(mine);
  auto gathered = co_await comm_.GatherBytes(report);
  std::vector<char> bytes;
  if (comm_.rank() == 0) bytes = EncodeCancelDecision(DecideCancel(gathered, cause));
  co_await comm_.BroadcastBytes(&bytes);
  const CancelDecision decision = DecodeCancelDecision(bytes);
  if (cause == CancelCause::kStall) {
    ++stats_.stall_warnings;
    stall_.Reported(Clock::now());
  }
  // Caches, rank 0's table and every reference to a pending request start
  // over on every rank at this same point of the protocol.
  Reset();
  table_.Cancel(decision.upto, decision.why);
}

// Rank 0: every request pending on some rank is cancelled up to its latest
// submission, with the stall report or the ranks' faults as the reason.
CancelDecision Controller::DecideCancel(const std::vector<std::vector<char>>& gathered, CancelCause cause) {
  CancelDecision decision;
  std::vector<std::vector<std::string>> names_by_rank(comm_.size());
  std::string faults;
  for (int r = 0; r < comm_.size(); ++r) {
    CancelReport report = DecodeCancelReport(gathered[r]);
    if (!report.fault.empty()) faults += (faults.empty() ? "" : "; ") + report.fault;
    for (auto& [name, seq] : report.pending) {
      auto [it, fresh] = decision.upto.emplace(name, seq);
      if (!fresh) it->second = std::max(it->second, seq);
      names_by_rank[r].push_back(std::move(name));
    }
  }
  if (cause == CancelCause::kStall) {
    decision.why = Status::Error(
        ErrorKind::kStall, StallInspector::Report(names_by_rank, config_.stall_shutdown_s, true) + scope_);
    std::fprintf(stderr, "%s\n", decision.why.message.c_str());
  } else {
    decision.why = Status::Error(ErrorKind::kInternal,
                                 "jaxcache: a failure inside the runtime (" + faults +
                                     ") cancelled every pending collective on every rank; the runtime "
                                     "keeps working");
  }
  return decision;
}

void Controller::Reset() {
  for (auto& [bit, r] : cached_) timeline_.NegotiateEnd(r->name);
  for (auto* r : unsent_) timeline_.NegotiateEnd(r->name);
  for (auto& [name, r] : sent_) timeline_.NegotiateEnd(name);
  DropRequests();
  cache_.Clear();
  message_.ReleaseAll();
  messages_.Clear();
  PublishLayout();
}

Task<> Controller::StallReport() {
  Writer w;
  std::vector<std::string> mine;
  for (const auto& [bit, r] : cached_) mine.push_back(r->name);
  for (const auto* r : unsent_) mine.push_back(r->name);
  for (const auto& [name, r] : sent_) mine.push_back(name);
  w.U32(static_cast<uint32_t>(mine.size()));
  for (const auto& n : mine) w.Str(n);
  auto gathered = co_await comm_.GatherBytes(w.buffer());
  if (comm_.rank() == 0) {
    std::vector<std::vector<std::string>> by_rank(comm_.size());
    for (int r = 0; r < comm_.size(); ++r) {
      Reader rd(gathered[r].data(), gathered[r].size());
      uint32_t n = rd.U32();
      for (uint32_t i = 0; i < n; ++i) by_rank[r].push_back(rd.Str());
    }
    std::string text = StallInspector::Report(by_rank, config_.stall_check_s, false) + scope_;
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  ++stats_.stall_warnings;
  stall_.Reported(Clock::now());
}

void Controller::FailAll(const Status& status, CycleOutcome* out) {
  for (auto& [bit, r] : cached_) out->failed.emplace_back(r, status);
  for (auto* r : unsent_) out->failed.emplace_back(r, status);
  for (auto& [name, r] : sent_) out->failed.emplace_back(r, status);
  for (auto* r : rejected_) out->failed.emplace_back(r, status);
  if (join_.requested()) out->failed.emplace_back(join_.request(), status);
  DropRequests();
}

void Controller::DropRequests() {
  cached_.clear();
  unsent_.clear();
  sent_.clear();
  invalid_.clear();
  rejected_.clear();
  join_.Reset();
}

void Controller::PublishLayout() {
  auto layout = cache_.Layout();
  std::lock_guard<std::mutex> lock(layout_mu_);
  layout_.swap(layout);
}

std::unordered_map<std::string, uint32_t> Controller::CacheLayout() const {
  std::lock_guard<std::mutex> lock(layout_mu_);
  return layout_;
}

}  // namespace jaxcache
