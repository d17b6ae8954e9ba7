#include "common.h"

#include <pthread.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

namespace jaxcache {

std::size_t ElementSize(DType d) {
  switch (d) {
#define JAXCACHE_DTYPE_SIZE(E, name, bytes) \
  case DType::k##E: return bytes;
    JAXCACHE_DTYPES(JAXCACHE_DTYPE_SIZE)
#undef JAXCACHE_DTYPE_SIZE
  }
  return 0;
}

const char* ErrorClassName(ErrorKind kind) {
  switch (kind) {
#define JAXCACHE_ERROR_CLASS(E, name, cls) \
  case ErrorKind::k##E: return cls;
    JAXCACHE_ERROR_KINDS(JAXCACHE_ERROR_CLASS)
#undef JAXCACHE_ERROR_CLASS
  }
  return "CollectiveError";
}

bool IsComplex(DType d) { return d == DType::kComplex64 || d == DType::kComplex128; }

bool IsInteger(DType d) {
  switch (d) {
    case DType::kBool: case DType::kInt8: case DType::kInt16: case DType::kInt32: case DType::kInt64:
    case DType::kUInt8: case DType::kUInt16: case DType::kUInt32: case DType::kUInt64:
      return true;
    case DType::kFloat16: case DType::kBFloat16: case DType::kFloat32: case DType::kFloat64:
    case DType::kComplex64: case DType::kComplex128:
      return false;
  }
  return false;
}

Scaling ScalingOf(ReduceOp op, double prescale, double postscale, DType dtype, int contributors) {
  if (op != ReduceOp::kAverage) return {prescale, postscale};
  if (IsInteger(dtype)) return {prescale, postscale / contributors};
  return {prescale / contributors, postscale};
}

int64_t TensorSpec::NumElements() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::size_t TensorSpec::RowBytes() const {
  std::size_t n = ElementSize(dtype);
  for (std::size_t i = 1; i < shape.size(); ++i) n *= static_cast<std::size_t>(shape[i]);
  return n;
}

void NameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

namespace {
thread_local bool exit_aborts = false;
void AbortOnExitFromMarkedThread() {
  if (exit_aborts) std::abort();
}
}  // namespace

void ExitAbortsOnThisThread() {
  // Registered once the static objects exist, so it runs before their destructors.
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(AbortOnExitFromMarkedThread); });
  exit_aborts = true;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

int64_t ScatterRows(int64_t rows, int size, int rank) {
  return rows / size + (rank < rows % size ? 1 : 0);
}

std::string TensorSpec::ShapeString() const {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) s += ",";
    if (i + 1 < shape.size()) s += " ";
  }
  return s + ")";
}

std::size_t Signature::NumBytes() const {
  std::size_t n = 0;
  for (const auto& t : tensors) n += t.NumBytes();
  return n;
}

void Writer::Sig(const Signature& s) {
  U8(static_cast<uint8_t>(s.kind));
  U8(static_cast<uint8_t>(s.op));
  F64(s.prescale);
  F64(s.postscale);
  I32(s.root);
  U8(static_cast<uint8_t>(s.device));
  U8(s.static_shapes ? 1 : 0);
  U32(static_cast<uint32_t>(s.splits.size()));
  for (int64_t v : s.splits) I64(v);
  I32(s.devices);
  U8(s.over_devices ? 1 : 0);
  U32(static_cast<uint32_t>(s.tensors.size()));
  for (const auto& t : s.tensors) {
    U8(static_cast<uint8_t>(t.dtype));
    U8(static_cast<uint8_t>(t.shape.size()));
    for (int64_t d : t.shape) I64(d);
  }
}

void Reader::Raw(void* out, std::size_t n) {
  if (p_ + n > end_) throw std::runtime_error("jaxcache: truncated control message");
  std::memcpy(out, p_, n);
  p_ += n;
}

std::string Reader::Str() {
  uint32_t n = U32();
  if (p_ + n > end_) throw std::runtime_error("jaxcache: truncated control message");
  std::string s(p_, n);
  p_ += n;
  return s;
}

namespace {
// A code read off the wire, refused when no enumerator has it (a corrupt message).
template <typename E>
E Code(uint8_t value, int count) {
  if (value >= count) throw std::runtime_error("jaxcache: corrupt control message (code out of range)");
  return static_cast<E>(value);
}
}  // namespace

Signature Reader::Sig() {
  Signature s;
  s.kind = Code<Kind>(U8(), kNumKinds);
  s.op = Code<ReduceOp>(U8(), kNumReduceOps);
  s.prescale = F64();
  s.postscale = F64();
  s.root = I32();
  s.device = Code<Device>(U8(), kNumDevices);
  s.static_shapes = U8() != 0;
  uint32_t nsplits = U32();
  if (nsplits > remaining() / sizeof(int64_t)) throw std::runtime_error("jaxcache: truncated control message");
  s.splits.resize(nsplits);
  for (auto& v : s.splits) v = I64();
  s.devices = I32();
  if (s.devices < 1) throw std::runtime_error("jaxcache: corrupt control message (device count)");
  s.over_devices = U8() != 0;
  uint32_t n = U32();
  // Each tensor takes at least its dtype and rank bytes: a count beyond what is left is
  // a truncated message, refused before anything is allocated for it.
  if (n > remaining() / 2) throw std::runtime_error("jaxcache: truncated control message");
  s.tensors.resize(n);
  for (auto& t : s.tensors) {
    t.dtype = Code<DType>(U8(), kNumDTypes);
    uint8_t ndim = U8();
    if (ndim > remaining() / sizeof(int64_t)) throw std::runtime_error("jaxcache: truncated control message");
    t.shape.resize(ndim);
    for (auto& d : t.shape) d = I64();
  }
  return s;
}

}  // namespace jaxcache
