// glibc malloc settings applied from inside the process (jaxcache/allocator.py
// decides which: those the user did not set). XLA:CPU allocates every result
// with malloc; glibc's defaults map a large buffer anew on every call (zeroed
// and faulted in by the kernel) and keep the arrays of XLA's worker threads on
// 4 KiB pages. The launcher sets the same tunables through GLIBC_TUNABLES;
// these make a job started by plain mpirun, Slurm or a scheduler behave alike.
#pragma once

#include <cstdint>
#include <cstddef>
#include <string>

namespace jaxcache {

// Applies one glibc tunable by mallopt: "glibc.malloc.arena_max",
// "glibc.malloc.mmap_max", "glibc.malloc.mmap_threshold" or
// "glibc.malloc.trim_threshold". False if glibc refused it (or off glibc);
// throws std::invalid_argument for another name.
bool SetMallocTunable(const std::string& name, int64_t value);

// What glibc.malloc.hugetlb=1 does, which no mallopt can: grows the main heap
// by `reserve` bytes (address space only; nothing is touched) and asks for
// transparent huge pages on it (madvise MADV_HUGEPAGE), so that buffers
// carved from it later are faulted in as 2 MiB pages. Returns the advised
// bytes (0 when the heap could not be grown or advised).
std::size_t AdviseHeapHugePages(std::size_t reserve);

}  // namespace jaxcache
