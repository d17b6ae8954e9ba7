#include "allocator.h"

#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#if defined(__GLIBC__)
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace jaxcache {

bool SetMallocTunable(const std::string& name, int64_t value) {
#if defined(__GLIBC__)
  int param;
  if (name == "glibc.malloc.arena_max") param = M_ARENA_MAX;
  else if (name == "glibc.malloc.mmap_max") param = M_MMAP_MAX;
  else if (name == "glibc.malloc.mmap_threshold") param = M_MMAP_THRESHOLD;
  else if (name == "glibc.malloc.trim_threshold") param = M_TRIM_THRESHOLD;
  else throw std::invalid_argument("jaxcache: no mallopt for tunable '" + name + "'");
  return mallopt(param, static_cast<int>(value)) == 1;
#else
  return false;
#endif
}

std::size_t AdviseHeapHugePages(std::size_t reserve) {
#if defined(__GLIBC__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t kHuge = std::uintptr_t(2) << 20;
  // The heap's top chunk grows to hold the block; freed, it stays there (the
  // trim threshold is above it) as untouched address space at the heap's end.
  void* block = std::malloc(reserve);
  if (!block) return 0;
  const auto start = reinterpret_cast<std::uintptr_t>(block);
  std::free(block);
  const auto begin = (start + kHuge - 1) & ~(kHuge - 1);
  const auto end = reinterpret_cast<std::uintptr_t>(sbrk(0)) & ~(kHuge - 1);
  // Still there: the block came from the heap (not a mapping) and was not trimmed.
  if (end <= begin || start + reserve > end + kHuge) return 0;
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) != 0) return 0;
  return end - begin;
#else
  (void)reserve;
  return 0;
#endif
}

}  // namespace jaxcache
