// Enums shared with Python and the wire, each generated from one list
// X(Enumerator, name, ...): the enum class (its codes are the list's order, so
// lists are append-only), kNum<Type>s for range checks, and <Type>Name() (the
// name the bindings export it under and messages show).
#pragma once

#include <cstdint>

#define JAXCACHE_ENUMERATOR(E, name, ...) k##E,
#define JAXCACHE_ENUM_COUNT(E, name, ...) +1
#define JAXCACHE_ENUM_NAME_CASE(E, name, ...) \
  case decltype(value)::k##E: return name;

#define JAXCACHE_DEFINE_ENUM(Type, LIST)                          \
  enum class Type : uint8_t { LIST(JAXCACHE_ENUMERATOR) };        \
  constexpr int kNum##Type##s = 0 LIST(JAXCACHE_ENUM_COUNT);      \
  constexpr const char* Type##Name(Type value) {                  \
    switch (value) { LIST(JAXCACHE_ENUM_NAME_CASE) }              \
    return "unknown"; /* a code checked where it entered cannot be out of range */ \
  }
