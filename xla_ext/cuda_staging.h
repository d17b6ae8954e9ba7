// Pinned host memory through which the CUDA handlers stage device buffers
// (tier A: the runtime and MPI only ever see host memory). Blocks are reused
// across calls: pinning memory costs far more than copying through it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace jaxcache {

class StagingPool {
 public:
  struct Block {
    char* data = nullptr;
    std::size_t bytes = 0;
    int device = -1;            // the device whose streams record `done`
    cudaEvent_t done = nullptr; // recorded after the last copy that uses the block
    bool leased = false;
  };

  // The process's pool. Never destroyed: freeing pinned memory during exit
  // could run after the CUDA driver has been torn down.
  static StagingPool& Get();

  // A block of at least `bytes` for the current device, reusing a free one
  // whose copies have completed. On failure returns null and sets `error`.
  Block* Acquire(std::size_t bytes, std::string* error);
  // Returns `block`; it is not handed out again before the work enqueued on
  // `stream` so far (the copies that read or write it) has completed.
  // Returns false (and sets `error`) when the event could not be recorded:
  // the block is then retired instead of risking reuse during a copy.
  bool Release(Block* block, cudaStream_t stream, std::string* error);

  // Bytes of pinned memory held (for tests and diagnostics).
  std::size_t held_bytes();

 private:
  StagingPool() = default;
  std::mutex mu_;
  std::vector<std::unique_ptr<Block>> blocks_;
};

// Holds a block for one collective and releases it on every path.
class StagingLease {
 public:
  StagingLease() = default;
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  ~StagingLease();

  bool Acquire(std::size_t bytes, cudaStream_t stream, std::string* error);
  char* data() const { return block_->data; }
  cudaEvent_t event() const { return block_->done; }
  // Releases now (after the last copy has been enqueued on the stream).
  bool Release(std::string* error);

 private:
  StagingPool::Block* block_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// "cudaMemcpyAsync: invalid argument" style text for a failed CUDA call.
std::string CudaErrorText(const char* call, cudaError_t err);

}  // namespace jaxcache
