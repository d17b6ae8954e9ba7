// A minimal unit-test harness (no GoogleTest on the build machines). TEST(Suite, Name)
// registers a case; CHECK* record a failure with file:line and let the case go on. The binary
// runs every case, or those named on its command line (--list prints them); 0: all passed.
#pragma once

#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace check {

struct Case { const char* name; void (*fn)(); };
inline std::vector<Case>& Cases() { static std::vector<Case> cases; return cases; }
inline int& Failures() { static int failures = 0; return failures; }
struct Registrar { Registrar(const char* name, void (*fn)()) { Cases().push_back({name, fn}); } };

inline void Fail(const char* file, int line, const std::string& msg) {
  ++Failures(), std::printf("  %s:%d: FAILED %s\n", file, line, msg.c_str());
}
// Integers compare by value whatever their signedness (2u == size_t{2}, no -Wsign-compare).
template <typename T> constexpr bool kNumber = std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                               !std::is_same_v<T, char>;
template <typename A, typename B> bool Equal(const A& a, const B& b) {
  if constexpr (kNumber<A> && kNumber<B>) return std::cmp_equal(a, b); else return a == b;
}
// Values in failure messages: enums as numbers, other unprintables as "?".
template <typename T> std::string Show(const T& v) {
  std::ostringstream out;
  if constexpr (std::is_enum_v<T>) out << static_cast<long long>(v);
  else if constexpr (requires { out << v; }) out << v; else out << "?";
  return out.str();
}
inline bool RunOne(const Case& c) {
  const int before = Failures();
  std::printf("[ RUN  ] %s\n", c.name);
  try { c.fn(); } catch (const std::exception& e) { Fail(c.name, 0, std::string("threw: ") + e.what()); }
  std::printf("[ %s ] %s\n", Failures() == before ? " OK " : "FAIL", c.name);
  return Failures() == before;
}
inline int Main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--list") == 0) {
    for (const Case& c : Cases()) std::printf("%s\n", c.name);
    return 0;
  }
  int failed = 0, ran = 0;
  for (const Case& c : Cases()) {
    bool wanted = argc == 1;
    for (int i = 1; i < argc; ++i) wanted |= std::strcmp(argv[i], c.name) == 0;
    if (wanted) failed += !RunOne(c), ++ran;
  }
  if (ran < (argc == 1 ? 1 : argc - 1)) return std::printf("unknown test name\n"), 2;  // a typo must not pass
  std::printf("%d of %d cases failed\n", failed, ran);
  return failed ? 1 : 0;
}
}  // namespace check
#define TEST(suite, name)                                                                 \
  static void suite##_##name();                                                           \
  static const ::check::Registrar suite##_##name##_r(#suite "." #name, &suite##_##name); \
  static void suite##_##name()
#define CHECK(cond) ((cond) ? void() : ::check::Fail(__FILE__, __LINE__, "CHECK(" #cond ")"))
#define CHECK_EQ(a, b)                                                                       \
  do {                                                                                       \
    const auto& a_ = (a);                                                                    \
    const auto& b_ = (b);                                                                    \
    if (!::check::Equal(a_, b_))                                                             \
      ::check::Fail(__FILE__, __LINE__,                                                      \
                    "CHECK_EQ(" #a ", " #b "): " + ::check::Show(a_) + " != " + ::check::Show(b_)); \
  } while (0)
#define CHECK_THROWS(expr)                                                                 \
  do {                                                                                     \
    bool thrown_ = false;                                                                  \
    try { (void)(expr); } catch (const std::exception&) { thrown_ = true; }                \
    if (!thrown_) ::check::Fail(__FILE__, __LINE__, "CHECK_THROWS(" #expr "): no throw"); \
  } while (0)
