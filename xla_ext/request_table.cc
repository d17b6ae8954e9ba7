#include "request_table.h"

#include <algorithm>
#include <stdexcept>

namespace jaxcache {

namespace {
thread_local InlineCompletion* inline_scope = nullptr;
}  // namespace

void Wakeup::Notify() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
  }
  cv_.notify_one();
}

bool Wakeup::WaitFor(std::chrono::microseconds timeout, uint64_t* seen) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return generation_ != *seen; });
  bool news = generation_ != *seen;
  *seen = generation_;
  return news;
}

uint64_t Wakeup::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

InlineCompletion::InlineCompletion(const Request* request)
    : request_(request), previous_(inline_scope) {
  inline_scope = this;
}

InlineCompletion::~InlineCompletion() { inline_scope = previous_; }

InlineCompletion* InlineCompletion::For(const Request* req) {
  return inline_scope && inline_scope->request_ == req ? inline_scope : nullptr;
}

RequestTable::~RequestTable() {
  Close(Status::Error(ErrorKind::kShutdown, "jaxcache: the runtime was destroyed"));
}

void RequestTable::Finish(RequestPtr req, const Status& status) {
  if (InlineCompletion* scope = InlineCompletion::For(req.get())) {
    req->done.Run(status);
    scope->MarkDone();
    return;
  }
  if (req->done.cheap()) {
    req->done.Run(status);
    return;
  }
  completions_.Push(std::move(req), status, completion_wakeups_);
}

bool RequestTable::Admit(RequestPtr req, bool notify) {
  Status refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      refused = closed_status_;
    } else {
      NameState& ns = names_[req->name];
      if (req->refuse_if_in_flight && !ns.queue.empty()) {
        refused = Status::Error(
            ErrorKind::kDuplicate,
            "jaxcache: a collective named '" + req->name +
                "' is already in flight on this rank; an explicitly named request must complete "
                "before the name is used again");
      } else {
        req->seq = ns.next_seq++;
        if (req->seq < ns.cancelled_below) {
          refused = Status::Error(cancel_status_.kind,
                                  cancel_status_.message + " (submission " +
                                      std::to_string(req->seq) + " of '" + req->name +
                                      "' was cancelled on every rank)");
        } else {
          Request* raw = req.get();
          held_.insert(raw);
          ns.queue.push_back(std::move(req));
          if (ns.queue.size() != 1) return false;
          raw->state = RequestState::kActive;
          activated_.push_back(raw);
          last_submitted_ = raw->submitted;
          if (notify) wakeup_.Notify();
          return true;
        }
      }
    }
  }
  Finish(std::move(req), refused);
  return false;
}

std::vector<Request*> RequestTable::TakeActive() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Request*> out;
  out.swap(activated_);
  for (Request* r : out) r->state = RequestState::kTaken;
  return out;
}

bool RequestTable::HasActive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !activated_.empty();
}

std::optional<RequestTable::ActiveBurst> RequestTable::Burst() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (activated_.empty()) return std::nullopt;
  return ActiveBurst{activated_.size(), activated_.front()->submitted, last_submitted_};
}

bool RequestTable::Complete(Request* req, const Status& status) {
  RequestPtr owned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_.count(req)) return false;
    if (req->state == RequestState::kQueued)
      throw std::logic_error("jaxcache: internal error: completing '" + req->name + "' (submission " +
                             std::to_string(req->seq) + "), which waits behind an earlier one");
    NameState& ns = names_.at(req->name);  // held and not queued: the front of its name
    owned = std::move(ns.queue.front());
    ns.queue.pop_front();
    held_.erase(req);
    if (!ns.queue.empty()) {
      Request* next = ns.queue.front().get();
      next->state = RequestState::kActive;
      activated_.push_back(next);
    }
  }
  Finish(std::move(owned), status);
  return true;
}

std::optional<RequestState> RequestTable::StateOf(const Request* req) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_.count(req)) return std::nullopt;
  return req->state;
}

std::vector<std::pair<std::string, uint64_t>> RequestTable::Pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const auto& [name, ns] : names_)
    for (const auto& r : ns.queue) out.emplace_back(name, r->seq);
  return out;
}

void RequestTable::Cancel(const std::map<std::string, uint64_t>& upto, const Status& why) {
  std::vector<RequestPtr> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_status_ = why;
    for (const auto& [name, last] : upto) {
      NameState& ns = names_[name];
      ns.cancelled_below = std::max(ns.cancelled_below, last + 1);
      while (!ns.queue.empty() && ns.queue.front()->seq <= last) {
        held_.erase(ns.queue.front().get());
        failed.push_back(std::move(ns.queue.front()));
        ns.queue.pop_front();
      }
    }
    activated_.clear();
    for (auto& [name, ns] : names_) {
      if (ns.queue.empty()) continue;
      ns.queue.front()->state = RequestState::kActive;
      activated_.push_back(ns.queue.front().get());
    }
  }
  wakeup_.Notify();
  for (auto& r : failed) Finish(std::move(r), why);
}

void RequestTable::Close(const Status& why) {
  std::vector<RequestPtr> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) {
      closed_ = true;
      closed_status_ = why;
    }
    for (auto& [name, ns] : names_)
      for (auto& r : ns.queue) failed.push_back(std::move(r));
    names_.clear();
    held_.clear();
    activated_.clear();
  }
  wakeup_.Notify();
  for (auto& r : failed) Finish(std::move(r), why);
}

bool RequestTable::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void RequestTable::CountStandIn(const std::string& name, int64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  NameState& ns = names_[name];
  ns.next_seq = seq >= 0 ? std::max(ns.next_seq, static_cast<uint64_t>(seq) + 1) : ns.next_seq + 1;
}

}  // namespace jaxcache
