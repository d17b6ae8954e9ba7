// The glibc malloc setting that no mallopt can apply, for a process started
// without the launcher's GLIBC_TUNABLES (jaxcache/allocator.py applies the
// others and decides which: those the user did not set). XLA:CPU allocates
// every result with malloc; on 4 KiB pages its copies and MPI's shared-memory
// transfers run markedly slower than on transparent huge pages (benchmarks/README.md, "Figures behind the runtime's comments").
#pragma once

#include <cstddef>

namespace jaxcache {

// What glibc.malloc.hugetlb=1 does, which no mallopt can: grows the main heap
// by `reserve` bytes (address space only; nothing is touched) and asks for
// transparent huge pages on it (madvise MADV_HUGEPAGE), so that buffers
// carved from it later are faulted in as 2 MiB pages. Returns the advised
// bytes (0 when the heap could not be grown or advised).
std::size_t AdviseHeapHugePages(std::size_t reserve);

}  // namespace jaxcache
