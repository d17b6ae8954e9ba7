#include "cuda_staging.h"

namespace jaxcache {

namespace {

// Rounds up by at most 1/8 (at least 64 KiB), so that a slowly growing
// request size does not allocate a new block each time.
std::size_t RoundUp(std::size_t bytes) {
  std::size_t grain = 64 << 10;
  if (bytes == 0) return grain;  // zero-size tensors still get a valid block
  while (grain * 8 < bytes) grain <<= 1;
  return (bytes + grain - 1) / grain * grain;
}

// True once every copy recorded on the block's event has completed.
bool Idle(const StagingPool::Block& b) {
  return !b.leased && (b.done == nullptr || cudaEventQuery(b.done) == cudaSuccess);
}

void Free(StagingPool::Block& b) {
  if (b.done) cudaEventDestroy(b.done);
  if (b.data) cudaFreeHost(b.data);
}

}  // namespace

std::string CudaErrorText(const char* call, cudaError_t err) {
  return std::string(call) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

StagingPool& StagingPool::Get() {
  static StagingPool* pool = new StagingPool();
  return *pool;
}

StagingPool::Block* StagingPool::Acquire(std::size_t bytes, std::string* error) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    *error = CudaErrorText("cudaGetDevice", err);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu_);
  Block* best = nullptr;
  for (auto& b : blocks_)
    if (b->device == device && b->bytes >= bytes && Idle(*b) && (!best || b->bytes < best->bytes))
      best = b.get();
  if (best) {
    best->leased = true;
    return best;
  }
  // Growing: idle blocks too small for this request are unlikely to serve
  // the next one either; free them so the pool holds what is in use.
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    if ((*it)->bytes < bytes && Idle(**it)) {
      Free(**it);
      it = blocks_.erase(it);
    } else {
      ++it;
    }
  }
  auto block = std::make_unique<Block>();
  block->device = device;
  block->bytes = RoundUp(bytes);
  // Portable: usable from any context. Blocking sync: a waiting thread sleeps
  // instead of spinning (the CPU is shared with the runtime's threads).
  if ((err = cudaHostAlloc(reinterpret_cast<void**>(&block->data), block->bytes,
                           cudaHostAllocPortable)) != cudaSuccess ||
      (err = cudaEventCreateWithFlags(&block->done, cudaEventDisableTiming |
                                                        cudaEventBlockingSync)) != cudaSuccess) {
    *error = CudaErrorText(block->data ? "cudaEventCreateWithFlags" : "cudaHostAlloc", err) +
             " for " + std::to_string(block->bytes) + " bytes of pinned staging memory";
    if (!block->data) block->done = nullptr;
    Free(*block);
    return nullptr;
  }
  block->leased = true;
  blocks_.push_back(std::move(block));
  return blocks_.back().get();
}

bool StagingPool::Release(Block* block, cudaStream_t stream, std::string* error) {
  cudaError_t err = cudaEventRecord(block->done, stream);
  std::lock_guard<std::mutex> lock(mu_);
  if (err != cudaSuccess) {
    // Without the event nothing tells when the stream is done with the
    // memory: keep it out of circulation (leaked, never reused).
    *error = CudaErrorText("cudaEventRecord", err);
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
      if (it->get() == block) {
        it->release();
        blocks_.erase(it);
        break;
      }
    return false;
  }
  block->leased = false;
  return true;
}

std::size_t StagingPool::held_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (auto& b : blocks_) n += b->bytes;
  return n;
}

StagingLease::~StagingLease() {
  std::string ignored;
  if (block_) Release(&ignored);
}

bool StagingLease::Acquire(std::size_t bytes, cudaStream_t stream, std::string* error) {
  stream_ = stream;
  block_ = StagingPool::Get().Acquire(bytes, error);
  return block_ != nullptr;
}

bool StagingLease::Release(std::string* error) {
  StagingPool::Block* b = block_;
  block_ = nullptr;
  return StagingPool::Get().Release(b, stream_, error);
}

}  // namespace jaxcache
