#include "tensor_queue.h"

namespace jaxcache {

Status TensorQueue::Push(RequestPtr* req) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return closed_status_;
  const std::string& name = (*req)->name;
  if (!in_flight_.insert(name).second) {
    return Status::Error(ErrorKind::kDuplicate,
                         "jaxcache: a collective named '" + name +
                             "' is already in flight on this rank; names must be unique among "
                             "concurrent collectives (give each call its own name=...)");
  }
  incoming_.push_back(std::move(*req));
  cv_.notify_one();
  return Status::Ok();
}

std::vector<RequestPtr> TensorQueue::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RequestPtr> out;
  out.swap(incoming_);
  return out;
}

void TensorQueue::Finish(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.erase(name);
}

bool TensorQueue::WaitFor(std::chrono::microseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !incoming_.empty() || woken_; });
  woken_ = false;
  return !incoming_.empty();
}

void TensorQueue::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  woken_ = true;
  cv_.notify_one();
}

void TensorQueue::Close(Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  closed_status_ = std::move(why);
  woken_ = true;
  cv_.notify_one();
}

bool TensorQueue::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

CompletionQueue::CompletionQueue() : thread_([this] { Loop(); }) {}

CompletionQueue::~CompletionQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void CompletionQueue::Push(RequestPtr req, Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  items_.emplace_back(std::move(req), std::move(status));
  cv_.notify_one();
}

void CompletionQueue::Loop() {
  std::vector<std::pair<RequestPtr, Status>> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !items_.empty(); });
      if (items_.empty() && stop_) return;
      batch.swap(items_);
    }
    for (auto& [req, status] : batch) req->done(status);
    batch.clear();
  }
}

}  // namespace jaxcache
