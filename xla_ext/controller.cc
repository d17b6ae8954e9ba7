#include "controller.h"

#include <cstdio>

namespace jaxcache {

namespace {
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
inline void SetBit(std::vector<uint64_t>& v, std::size_t b) { v[b / 64] |= 1ull << (b % 64); }
inline bool GetBit(const std::vector<uint64_t>& v, std::size_t b) { return (v[b / 64] >> (b % 64)) & 1; }
}  // namespace

Controller::Controller(Comm& comm, const Config& config, Stats& stats, Timeline& timeline)
    : comm_(comm),
      config_(config),
      stats_(stats),
      timeline_(timeline),
      cache_(static_cast<std::size_t>(config.cache_capacity)),
      table_(comm.size()),
      stall_(config) {}

void Controller::Add(RequestPtr req) {
  uint32_t bit = 0;
  auto found = cache_.capacity() ? cache_.Find(req->name, req->sig, &bit) : ResponseCache::Lookup::kMiss;
  timeline_.NegotiateBegin(req->name, found == ResponseCache::Lookup::kHit ? "cached" : "coordinator");
  if (found == ResponseCache::Lookup::kHit) {
    cached_[bit] = std::move(req);
    return;
  }
  if (found == ResponseCache::Lookup::kInvalid) invalid_.push_back(bit);
  ++stats_.cache_misses;
  unsent_.push_back(std::move(req));
}

void Controller::MoveToUncached(uint32_t bit) {
  auto it = cached_.find(bit);
  if (it == cached_.end()) return;
  ++stats_.cache_misses;
  unsent_.push_back(std::move(it->second));
  cached_.erase(it);
}

Clock::time_point Controller::OldestPending() const {
  Clock::time_point oldest = Clock::now();
  for (const auto& [bit, r] : cached_) oldest = std::min(oldest, r->submitted);
  for (const auto& r : unsent_) oldest = std::min(oldest, r->submitted);
  for (const auto& [name, r] : sent_) oldest = std::min(oldest, r->submitted);
  return oldest;
}

CycleOutcome Controller::RunCycle(bool want_shutdown, const std::function<void()>& between_polls) {
  CycleOutcome out;
  auto t0 = Clock::now();
  ++stats_.cycles;
  timeline_.Cycle(stats_.cycles);

  const std::size_t cap = cache_.capacity();
  const std::size_t nbits = cap + kNumFlags;
  std::vector<uint64_t> bits((nbits + 63) / 64, 0);
  for (const auto& [bit, req] : cached_) SetBit(bits, bit);
  // Flags are stored inverted: the AND of "not X" is "no rank has X".
  bool stall_report = false, stall_shutdown = false;
  if (HasPending() && t0 - last_stall_scan_ > std::chrono::milliseconds(200)) {
    last_stall_scan_ = t0;
    auto oldest = OldestPending();
    stall_report = stall_.WantsReport(oldest, t0);
    stall_shutdown = stall_.WantsShutdown(oldest, t0);
  }
  bool local_flags[kNumFlags] = {want_shutdown, !unsent_.empty(), !invalid_.empty(),
                                 stall_report, stall_shutdown};
  for (int f = 0; f < kNumFlags; ++f)
    if (!local_flags[f]) SetBit(bits, cap + f);

  comm_.PolledAllreduce(bits.data(), static_cast<int>(bits.size()), MPI_BAND, between_polls);
  ++stats_.bitvector_syncs;
  auto any = [&](Flag f) { return !GetBit(bits, cap + f); };

  if (any(kShutdown)) {
    FailAll(Status::Error(ErrorKind::kShutdown,
                          "jaxcache: the runtime was shut down (shutdown() was called on at least "
                          "one rank); collectives can no longer complete"),
            &out);
    out.shutdown = true;
    stats_.AddNegotiation(Since(t0));
    return out;
  }

  if (any(kInvalid)) {
    std::vector<uint64_t> inv((cap + 63) / 64, 0);
    for (uint32_t b : invalid_) SetBit(inv, b);
    invalid_.clear();
    comm_.Allreduce(inv.data(), static_cast<int>(inv.size()), MPI_BOR);
    for (uint32_t b = 0; b < cap; ++b) {
      if (!GetBit(inv, b)) continue;
      bits[b / 64] &= ~(1ull << (b % 64));  // an invalidated entry is no hit
      MoveToUncached(b);
      cache_.Erase(b);
      ++stats_.cache_invalidations;
    }
    PublishLayout();
  }

  // Common hits, ascending bit order: identical on every rank.
  for (auto it = cached_.begin(); it != cached_.end();) {
    if (!GetBit(bits, it->first)) { ++it; continue; }
    uint32_t bit = it->first;
    RequestPtr req = std::move(it->second);
    it = cached_.erase(it);
    cache_.Touch(bit);
    ++stats_.cache_hits;
    timeline_.NegotiateEnd(req->name);
    timeline_.Begin(req->name, "QUEUE");
    out.work.push_back({std::move(req)});
  }

  if (any(kUncached)) CoordinatorRound(&out);
  if (any(kStallReport) || any(kStallShutdown)) HandleStall(any(kStallShutdown), &out);

  out.progress = !out.work.empty() || !out.failed.empty();
  stats_.AddNegotiation(Since(t0));
  return out;
}

void Controller::CoordinatorRound(CycleOutcome* out) {
  ++stats_.coordinator_rounds;
  Writer w;
  for (auto& req : unsent_) {
    w.Str(req->name);
    w.Sig(req->sig);
    std::string name = req->name;
    sent_[name] = std::move(req);
  }
  unsent_.clear();
  auto gathered = comm_.GatherBytes(w.buffer());

  std::vector<char> response_bytes;
  if (comm_.rank() == 0) {
    Writer rw;
    for (int r = 0; r < comm_.size(); ++r) {
      Reader rd(gathered[r].data(), gathered[r].size());
      while (!rd.done()) {
        std::string name = rd.Str();
        Signature sig = rd.Sig();
        timeline_.NegotiateBegin(name, "coordinator");
        timeline_.Instant(name, "rank " + std::to_string(r) + " ready");
        if (auto resp = table_.Add(r, name, sig)) {
          rw.Str(resp->name);
          rw.U8(static_cast<uint8_t>(resp->status.kind));
          rw.Str(resp->status.message);
          rw.Sig(resp->sig);
        }
      }
    }
    response_bytes = std::move(rw.buffer());
  }
  comm_.BroadcastBytes(&response_bytes);

  Reader rd(response_bytes.data(), response_bytes.size());
  bool cache_changed = false;
  while (!rd.done()) {
    Response resp;
    resp.name = rd.Str();
    resp.status.kind = static_cast<ErrorKind>(rd.U8());
    resp.status.message = rd.Str();
    resp.sig = rd.Sig();
    auto it = sent_.find(resp.name);
    if (it == sent_.end()) continue;  // cannot happen: a response needs every rank's request
    RequestPtr req = std::move(it->second);
    sent_.erase(it);
    timeline_.NegotiateEnd(resp.name);
    if (!resp.status.ok()) {
      out->failed.emplace_back(std::move(req), resp.status);
      continue;
    }
    if (cache_.capacity()) {
      InsertIntoCache(resp);
      cache_changed = true;
    }
    timeline_.Begin(resp.name, "QUEUE");
    out->work.push_back({std::move(req)});
  }
  if (cache_changed) PublishLayout();
}

void Controller::InsertIntoCache(const Response& resp) {
  std::optional<std::string> evicted;
  uint32_t bit = cache_.Insert(resp.name, resp.sig, &evicted);
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

void Controller::HandleStall(bool shutdown, CycleOutcome* out) {
  Writer w;
  std::vector<std::string> mine;
  for (const auto& [bit, r] : cached_) mine.push_back(r->name);
  for (const auto& r : unsent_) mine.push_back(r->name);
  for (const auto& [name, r] : sent_) mine.push_back(name);
  w.U32(static_cast<uint32_t>(mine.size()));
  for (const auto& n : mine) w.Str(n);
  auto gathered = comm_.GatherBytes(w.buffer());
  std::vector<char> report;
  if (comm_.rank() == 0) {
    std::vector<std::vector<std::string>> by_rank(comm_.size());
    for (int r = 0; r < comm_.size(); ++r) {
      Reader rd(gathered[r].data(), gathered[r].size());
      uint32_t n = rd.U32();
      for (uint32_t i = 0; i < n; ++i) by_rank[r].push_back(rd.Str());
    }
    double threshold = shutdown ? config_.stall_shutdown_s : config_.stall_check_s;
    std::string text = StallInspector::Report(by_rank, threshold, shutdown);
    std::fprintf(stderr, "%s\n", text.c_str());
    report.assign(text.begin(), text.end());
  }
  ++stats_.stall_warnings;
  stall_.Reported(Clock::now());
  if (!shutdown) return;
  comm_.BroadcastBytes(&report);
  FailAll(Status::Error(ErrorKind::kStall, std::string(report.begin(), report.end())), out);
  table_.Clear();
}

void Controller::FailAll(const Status& status, CycleOutcome* out) {
  for (auto& [bit, r] : cached_) out->failed.emplace_back(std::move(r), status);
  for (auto& r : unsent_) out->failed.emplace_back(std::move(r), status);
  for (auto& [name, r] : sent_) out->failed.emplace_back(std::move(r), status);
  cached_.clear();
  unsent_.clear();
  sent_.clear();
  invalid_.clear();
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
