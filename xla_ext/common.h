// Types shared by every part of the runtime: dtypes, reduce ops, collective
// kinds, tensor signatures and the status values that travel between ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/kinds.h"
#include "enums.h"

namespace jaxcache {

// Our own dtype codes: stable across XLA versions and frameworks, and small
// enough to serialize in one byte. X(Enumerator, NumPy's name (ml_dtypes' for
// bfloat16, which torch and TensorFlow share), element bytes).
#define JAXCACHE_DTYPES(X)                                                          \
  X(Bool, "bool", 1) X(Int8, "int8", 1) X(Int16, "int16", 2) X(Int32, "int32", 4)  \
  X(Int64, "int64", 8) X(UInt8, "uint8", 1) X(UInt16, "uint16", 2)                 \
  X(UInt32, "uint32", 4) X(UInt64, "uint64", 8) X(Float16, "float16", 2)           \
  X(BFloat16, "bfloat16", 2) X(Float32, "float32", 4) X(Float64, "float64", 8)     \
  X(Complex64, "complex64", 8) X(Complex128, "complex128", 16)
JAXCACHE_DEFINE_ENUM(DType, JAXCACHE_DTYPES)

// kAverage is a sum divided by the number of ranks that contribute (those that
// have not joined, see join_state.h); the runtime applies the division.
#define JAXCACHE_REDUCE_OPS(X) X(Sum, "sum") X(Min, "min") X(Max, "max") X(Prod, "prod") X(Average, "average")
JAXCACHE_DEFINE_ENUM(ReduceOp, JAXCACHE_REDUCE_OPS)
// The collective kinds (collectives/kinds.h lists them; collective.h says what each does).
JAXCACHE_DEFINE_ENUM(Kind, JAXCACHE_KINDS)
// Where the submitter's tensors live. The runtime always works on host memory
// (the CUDA handlers stage through it), but the kind is part of the signature:
// a CPU array on one rank against a GPU array on another is a user error.
#define JAXCACHE_DEVICES(X) X(Cpu, "cpu") X(Cuda, "cuda")
JAXCACHE_DEFINE_ENUM(Device, JAXCACHE_DEVICES)

std::size_t ElementSize(DType dtype);
// The operator MPI applies for `op` (an average reduces as a sum).
inline ReduceOp Reduction(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }
// Rows of a first dimension of `rows` that reducescatter gives rank `rank`:
// the first rows % size ranks get one more (Horovod's uneven split).
int64_t ScatterRows(int64_t rows, int size, int rank);
// "rank 3" or "ranks 1, 2", for messages.
std::string RankList(const std::vector<int>& ranks);
// Names the calling thread as `top -H`, gdb and perf show it (at most 15 characters).
void NameThisThread(const char* name);
// Marks this thread as one that the runtime's objects join: exit() called on it
// (MPICH's MPI_Abort, or MPICH ending the process inside an MPI call) then ends
// the process by SIGABRT. The static destructors would join this very thread,
// and std::terminate would print a second report that reads as a crash; a death
// by a signal is also what makes Hydra's proxy kill the other ranks at once (the
// multihost link-fault test hangs when such a process exits normally).
void ExitAbortsOnThisThread();
bool IsComplex(DType dtype);
bool IsInteger(DType dtype);  // bool counts as an integer

// The factors a reduction of `dtype` applies to each operand (pre) and to the
// result (post): the user's prescale and postscale, with an average's division by
// the `contributors` folded in -- before the sum for floating types (the sum
// cannot overflow), after it for integers, which are scaled in double precision
// and truncated toward zero (Horovod's rule: an average of equal integers is exact).
struct Scaling {
  double pre = 1.0, post = 1.0;
};
Scaling ScalingOf(ReduceOp op, double prescale, double postscale, DType dtype, int contributors);

// Why a request failed; each kind raises the Python exception class that
// ErrorClassName names (jaxcache/errors.py defines the classes).
// X(Enumerator, name, Python class).
#define JAXCACHE_ERROR_KINDS(X)                                                     \
  X(None, "none", "") X(Mismatch, "mismatch", "MismatchError") X(Stall, "stall", "StallError") \
  X(Shutdown, "shutdown", "ShutdownError") X(Duplicate, "duplicate", "DuplicateNameError")    \
  X(InvalidArgument, "invalid_argument", "InvalidArgumentError") X(Internal, "internal", "CollectiveError")
JAXCACHE_DEFINE_ENUM(ErrorKind, JAXCACHE_ERROR_KINDS)
const char* ErrorClassName(ErrorKind kind);  // "" for kNone

struct Status {
  ErrorKind kind = ErrorKind::kNone;
  std::string message;
  bool ok() const { return kind == ErrorKind::kNone; }
  static Status Ok() { return {}; }
  static Status Error(ErrorKind k, std::string m) { return {k, std::move(m)}; }
};

struct TensorSpec {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  int64_t NumElements() const;
  std::size_t NumBytes() const { return NumElements() * ElementSize(dtype); }
  // Rows along the first dimension (a scalar is one row) and bytes per row.
  int64_t Rows() const { return shape.empty() ? 1 : shape[0]; }
  std::size_t RowBytes() const;
  bool operator==(const TensorSpec& o) const { return dtype == o.dtype && shape == o.shape; }
  std::string ShapeString() const;
};

// Everything that must agree across ranks for one named collective. A group
// is one signature with several tensors.
struct Signature {
  Kind kind = Kind::kAllreduce;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = 0;  // broadcast, reduce
  Device device = Device::kCpu;
  // allgather / alltoall: the submitter sized its outputs for equal shapes on
  // every rank (jit, preallocated eager outputs), so the ranks must agree on
  // them; otherwise the executor allocates outputs of the agreed size.
  bool static_shapes = false;
  // alltoall: rows this rank sends to each rank (empty: equal blocks).
  std::vector<int64_t> splits;
  // The devices of this process taking part (device_parts.h): `tensors` holds
  // each device's operands in turn, in device-position order.
  int32_t devices = 1;
  // allreduce: also reduce over those devices, so that every device gets the
  // reduction over every device of every process (Operations reduces the
  // devices' tensors in host memory; axis_name= in jaxcache/ops/hierarchical.py).
  bool over_devices = false;
  std::vector<TensorSpec> tensors;
  bool operator==(const Signature& o) const {
    return kind == o.kind && op == o.op && prescale == o.prescale &&
           postscale == o.postscale && root == o.root && device == o.device &&
           static_shapes == o.static_shapes && splits == o.splits && devices == o.devices &&
           over_devices == o.over_devices && tensors == o.tensors;
  }
  bool operator!=(const Signature& o) const { return !(*this == o); }
  std::size_t NumBytes() const;
};

// Little binary writer/reader for the control-plane messages.
class Writer {
 public:
  void U8(uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { Raw(&v, sizeof v); }
  void I32(int32_t v) { Raw(&v, sizeof v); }
  void I64(int64_t v) { Raw(&v, sizeof v); }
  void F64(double v) { Raw(&v, sizeof v); }
  void Str(const std::string& s) { U32(static_cast<uint32_t>(s.size())); Raw(s.data(), s.size()); }
  void Sig(const Signature& s);
  std::vector<char>& buffer() { return buf_; }

 private:
  void Raw(const void* p, std::size_t n) {
    const char* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
  }
  std::vector<char> buf_;
};

class Reader {
 public:
  Reader(const char* data, std::size_t size) : p_(data), end_(data + size) {}
  bool done() const { return p_ >= end_; }
  std::size_t remaining() const { return static_cast<std::size_t>(end_ - p_); }
  uint8_t U8() { uint8_t v; Raw(&v, 1); return v; }
  uint32_t U32() { uint32_t v; Raw(&v, sizeof v); return v; }
  int32_t I32() { int32_t v; Raw(&v, sizeof v); return v; }
  int64_t I64() { int64_t v; Raw(&v, sizeof v); return v; }
  double F64() { double v; Raw(&v, sizeof v); return v; }
  std::string Str();
  Signature Sig();

 private:
  void Raw(void* out, std::size_t n);
  const char* p_;
  const char* end_;
};

}  // namespace jaxcache
