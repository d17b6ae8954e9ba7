#include "completion_queue.h"

#include "common.h"

namespace jaxcache {

Completion& Completion::operator=(Completion&& o) noexcept {
  if (this != &o) {
    if (fn_) Run(Status::Error(ErrorKind::kInternal, "jaxcache: internal error: completion replaced"));
    fn_ = std::move(o.fn_);
    cheap_ = o.cheap_;
    o.fn_ = nullptr;
  }
  return *this;
}

Completion::~Completion() {
  if (fn_)
    Run(Status::Error(ErrorKind::kInternal,
                      "jaxcache: internal error: a collective was dropped before it completed"));
}

void Completion::Run(const Status& status) {
  Fn fn = std::move(fn_);
  fn_ = nullptr;
  if (!fn) return;
  try {
    fn(status);
  } catch (...) {
    // A callback only signals a waiter; nothing sensible is left to do.
  }
}

CompletionQueue::CompletionQueue() : thread_([this] {
  NameThisThread("jaxcache-done");
  ExitAbortsOnThisThread();
  Loop();
}) {}

CompletionQueue::~CompletionQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

namespace {
thread_local CompletionQueue::Batch* current_batch = nullptr;
}  // namespace

CompletionQueue::Batch::Batch(CompletionQueue& queue) : queue_(queue), outer_(current_batch) {
  current_batch = this;
}

CompletionQueue::Batch::~Batch() {
  current_batch = outer_;
  if (!pushed_) return;
  if (wakeups_) ++*wakeups_;
  queue_.cv_.notify_one();
}

void CompletionQueue::WakeLocked(std::atomic<int64_t>* wakeups) {
  for (Batch* b = current_batch; b; b = b->outer_) {
    if (&b->queue_ == this) {
      b->pushed_ = true;
      if (wakeups) b->wakeups_ = wakeups;
      return;
    }
  }
  if (wakeups) ++*wakeups;
  cv_.notify_one();
}

void CompletionQueue::Push(RequestPtr req, Status status, std::atomic<int64_t>* wakeups) {
  std::lock_guard<std::mutex> lock(mu_);
  items_.emplace_back(std::move(req), std::move(status));
  WakeLocked(wakeups);
}

void CompletionQueue::Push(Completion done, Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  bare_.emplace_back(std::move(done), std::move(status));
  WakeLocked(nullptr);
}

void CompletionQueue::Loop() {
  std::vector<std::pair<RequestPtr, Status>> batch;
  std::vector<std::pair<Completion, Status>> bare;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !items_.empty() || !bare_.empty(); });
      if (items_.empty() && bare_.empty() && stop_) return;
      batch.swap(items_);
      bare.swap(bare_);
    }
    for (auto& [req, status] : batch) req->done.Run(status);
    for (auto& [done, status] : bare) done.Run(status);
    batch.clear();
    bare.clear();
  }
}

}  // namespace jaxcache
