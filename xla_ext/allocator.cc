#include "allocator.h"

#include <cstdint>
#include <cstdlib>

#if defined(__GLIBC__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace jaxcache {

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
