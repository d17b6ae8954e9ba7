// Coroutines for the runtime's collective steps.
//
// One background thread serves every process set, and the sets may overlap:
// a blocking MPI call of one set could wait for a rank that is itself blocked
// in another set's call, waiting for us. So every MPI step of a cycle is a
// nonblocking call that the cycle *awaits*: the coroutine parks the request on
// its set's Comm and returns control to the driver, which polls every set's
// parked request and resumes the coroutine whose request completed. A set
// waiting for a slow rank thus never delays another set.
//
// Task<T> is a lazily started coroutine: `co_await task` runs it and resumes
// the awaiter when it finishes (symmetric transfer, no recursion on resume);
// a root task is started and inspected by its driver through Start()/done().
//
// Await a Task<T> into a variable, not inside an `if` condition: GCC 12 built
// `if (co_await t) co_return;` into an illegal instruction (SIGILL) here.
#pragma once

#include <coroutine>
#include <exception>
#include <optional>
#include <utility>

namespace jaxcache {

template <typename T>
class Task;

namespace detail {

struct PromiseBase {
  std::coroutine_handle<> continuation;
  std::exception_ptr error;

  std::suspend_always initial_suspend() noexcept { return {}; }
  struct Final {
    bool await_ready() noexcept { return false; }
    template <typename P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      auto next = h.promise().continuation;
      return next ? next : std::noop_coroutine();
    }
    void await_resume() noexcept {}
  };
  Final final_suspend() noexcept { return {}; }
  void unhandled_exception() { error = std::current_exception(); }
};

template <typename T>
struct Promise : PromiseBase {
  std::optional<T> value;
  Task<T> get_return_object();
  template <typename U>
  void return_value(U&& v) { value.emplace(std::forward<U>(v)); }
  T take() {
    if (error) std::rethrow_exception(error);
    return std::move(*value);
  }
};

template <>
struct Promise<void> : PromiseBase {
  Task<void> get_return_object();
  void return_void() {}
  void take() {
    if (error) std::rethrow_exception(error);
  }
};

}  // namespace detail

template <typename T = void>
class [[nodiscard]] Task {
 public:
  using promise_type = detail::Promise<T>;
  using Handle = std::coroutine_handle<promise_type>;

  Task() = default;
  explicit Task(Handle h) : h_(h) {}
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() {
    if (h_) h_.destroy();
  }

  // Awaiting a task runs it; the awaiter resumes when it is done.
  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiter) noexcept {
    h_.promise().continuation = awaiter;
    return h_;
  }
  T await_resume() { return h_.promise().take(); }

  // For a root task: runs it until it first parks (or finishes).
  void Start() { h_.resume(); }
  bool valid() const { return static_cast<bool>(h_); }
  bool done() const { return h_ && h_.done(); }
  // The result of a finished root task (rethrows its exception).
  T Take() { return h_.promise().take(); }

 private:
  Handle h_;
};

namespace detail {
template <typename T>
Task<T> Promise<T>::get_return_object() {
  return Task<T>(std::coroutine_handle<Promise<T>>::from_promise(*this));
}
inline Task<void> Promise<void>::get_return_object() {
  return Task<void>(std::coroutine_handle<Promise<void>>::from_promise(*this));
}
}  // namespace detail

}  // namespace jaxcache
