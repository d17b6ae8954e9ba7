#include "reduce_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace jaxcache {

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while ((mant & 0x400u) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t FloatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (absx < 0x38800000u) {  // subnormal or zero in half
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    int shift = 113 - static_cast<int>(absx >> 23) + 13;
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((absx - 0x38000000u) >> 13);
  uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  return std::bit_cast<float>(bits);
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// ---- element-wise reduction kernels ------------------------------------------------------
// Integers: the formulas of MPICH's builtin operators, which MPI applies to them too.
// Floating point: IEEE 754-2019 minimum/maximum. A NaN on any rank gives NaN (one quiet
// NaN, whatever the payloads) and -0 < +0. MPI's builtin MIN/MAX (a > b ? b : a) give a
// result that depends on the order of the operands for NaN and signed zeros, and MPI's
// algorithms order them differently on different ranks: ranks got different bits.
// These are commutative bit for bit, so every reduction order gives the same result;
// float min/max therefore always run through them (MpiOp), never through MPI_MIN/MAX.

template <typename T>
inline T FloatMin(T a, T b) {
  if (a != a || b != b) return std::numeric_limits<T>::quiet_NaN();
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

template <typename T>
inline T FloatMax(T a, T b) {
  if (a != a || b != b) return std::numeric_limits<T>::quiet_NaN();
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

template <typename T, ReduceOp kOp>
inline T Combine(T a, T b) {
  if constexpr (kOp == ReduceOp::kSum) return a + b;
  else if constexpr (kOp == ReduceOp::kProd) return a * b;
  else if constexpr (std::is_floating_point_v<T> && kOp == ReduceOp::kMin) return FloatMin(a, b);
  else if constexpr (std::is_floating_point_v<T>) return FloatMax(a, b);
  else if constexpr (kOp == ReduceOp::kMin) return a > b ? b : a;
  else return a < b ? b : a;
}

template <typename T, ReduceOp kOp>
void ReduceArray(const void* in, void* inout, int64_t n) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int64_t i = 0; i < n; ++i) b[i] = Combine<T, kOp>(a[i], b[i]);
}

template <typename T>
void ReduceTyped(ReduceOp op, const void* in, void* inout, int64_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:  // reduces as a sum; the division comes after (Reduction())
      return ReduceArray<T, ReduceOp::kSum>(in, inout, n);
    case ReduceOp::kProd: return ReduceArray<T, ReduceOp::kProd>(in, inout, n);
    case ReduceOp::kMin: return ReduceArray<T, ReduceOp::kMin>(in, inout, n);
    case ReduceOp::kMax: return ReduceArray<T, ReduceOp::kMax>(in, inout, n);
  }
}

template <typename T>
void ReduceComplex(ReduceOp op, const void* in, void* inout, int64_t n) {
  auto* a = static_cast<const std::complex<T>*>(in);
  auto* b = static_cast<std::complex<T>*>(inout);
  if (op == ReduceOp::kSum || op == ReduceOp::kAverage) {
    ReduceArray<T, ReduceOp::kSum>(in, inout, 2 * n);
  } else {  // prod (min/max are refused for complex upstream)
    for (int64_t i = 0; i < n; ++i) b[i] = a[i] * b[i];
  }
}

// ---- half precision: float16 through F16C when the CPU has it, bfloat16 by shifts ----------
// Both are chosen at run time, so one build serves every x86-64 CPU.

constexpr int64_t kHalfBlock = 256;  // floats converted per block (fits in L1)

inline void BFloat16ToFloats(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &bits, sizeof bits);
  }
}

inline void FloatsToBFloat16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {  // branch-free, so the loop vectorizes
    uint32_t x;
    std::memcpy(&x, in + i, sizeof x);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (x >> 16) | 0x40u;
    bool nan = (x & 0x7fffffffu) > 0x7f800000u;
    out[i] = static_cast<uint16_t>(nan ? quiet_nan : rounded);
  }
}

inline void HalfToFloatsScalar(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

inline void FloatsToHalfScalar(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx,f16c"))) void HalfToFloatsF16C(const uint16_t* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

__attribute__((target("avx,f16c"))) void FloatsToHalfF16C(const float* in, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

bool HasF16C() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}
#else
bool HasF16C() { return false; }
void HalfToFloatsF16C(const uint16_t* in, float* out, int64_t n) { HalfToFloatsScalar(in, out, n); }
void FloatsToHalfF16C(const float* in, uint16_t* out, int64_t n) { FloatsToHalfScalar(in, out, n); }
#endif

void HalfToFloats(bool bf16, const uint16_t* in, float* out, int64_t n) {
  if (bf16) BFloat16ToFloats(in, out, n);
  else if (HasF16C()) HalfToFloatsF16C(in, out, n);
  else HalfToFloatsScalar(in, out, n);
}

void FloatsToHalves(bool bf16, const float* in, uint16_t* out, int64_t n) {
  if (bf16) FloatsToBFloat16(in, out, n);
  else if (HasF16C()) FloatsToHalfF16C(in, out, n);
  else FloatsToHalfScalar(in, out, n);
}

// Reduces half-precision values through float, a block at a time.
template <ReduceOp kOp>
void ReduceHalfBlocks(bool bf16, const uint16_t* a, uint16_t* b, int64_t n) {
  float fa[kHalfBlock], fb[kHalfBlock];
  for (int64_t off = 0; off < n; off += kHalfBlock) {
    int64_t m = std::min(kHalfBlock, n - off);
    HalfToFloats(bf16, a + off, fa, m);
    HalfToFloats(bf16, b + off, fb, m);
    for (int64_t i = 0; i < m; ++i) {
      float x = fa[i], y = fb[i];
      if constexpr (kOp == ReduceOp::kSum) fb[i] = x + y;
      else if constexpr (kOp == ReduceOp::kProd) fb[i] = x * y;
      else if constexpr (kOp == ReduceOp::kMin) fb[i] = FloatMin(x, y);
      else fb[i] = FloatMax(x, y);
    }
    FloatsToHalves(bf16, fb, b + off, m);
  }
}

void ReduceHalf(bool bf16, ReduceOp op, const void* in, void* inout, int64_t n) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:  // reduces as a sum (Reduction())
      return ReduceHalfBlocks<ReduceOp::kSum>(bf16, a, b, n);
    case ReduceOp::kProd: return ReduceHalfBlocks<ReduceOp::kProd>(bf16, a, b, n);
    case ReduceOp::kMin: return ReduceHalfBlocks<ReduceOp::kMin>(bf16, a, b, n);
    case ReduceOp::kMax: return ReduceHalfBlocks<ReduceOp::kMax>(bf16, a, b, n);
  }
}

template <bool kBF16, ReduceOp kOp>
void HalfReduce(void* invec, void* inoutvec, int* len, MPI_Datatype*) {
  ReduceHalfBlocks<kOp>(kBF16, static_cast<const uint16_t*>(invec), static_cast<uint16_t*>(inoutvec), *len);
}

MPI_Op half_ops[2][4];  // [float16, bfloat16][op]

template <typename T, ReduceOp kOp>
void FloatMinMax(void* invec, void* inoutvec, int* len, MPI_Datatype*) {
  ReduceArray<T, kOp>(invec, inoutvec, *len);
}

MPI_Op float_ops[2][2];  // [float32, float64][min, max]
bool ops_ready = false;

// Above this size, scaled copies into a separate output use streaming stores:
// the output is not read back soon (MPI reads it later, from memory anyway), and
// skipping the read-for-ownership of fresh pages makes the copy as cheap as memcpy.
constexpr int64_t kStreamingBytes = 8 << 20;  // beyond the caches

template <typename T>
void ScaleReal(const void* in, void* out, int64_t n, double factor) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(out);
  T f = static_cast<T>(factor);
  int64_t i = 0;
#if defined(__SSE2__)
  if (in != out && n * int64_t(sizeof(T)) >= kStreamingBytes) {
    while (i < n && (reinterpret_cast<uintptr_t>(b + i) & 15)) { b[i] = a[i] * f; ++i; }
    if constexpr (std::is_same_v<T, float>) {
      __m128 vf = _mm_set1_ps(f);
      for (; i + 4 <= n; i += 4) _mm_stream_ps(b + i, _mm_mul_ps(_mm_loadu_ps(a + i), vf));
    } else {
      __m128d vf = _mm_set1_pd(f);
      for (; i + 2 <= n; i += 2) _mm_stream_pd(b + i, _mm_mul_pd(_mm_loadu_pd(a + i), vf));
    }
    _mm_sfence();
  }
#endif
  for (; i < n; ++i) b[i] = a[i] * f;
}

// Integers scale in double precision, truncated toward zero and saturated at
// the type's limits (Horovod's rule; a float-to-int conversion out of range is
// undefined behaviour).
template <typename T>
void ScaleInteger(const void* in, void* out, int64_t n, double factor) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(out);
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::lowest());
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  for (int64_t i = 0; i < n; ++i) {
    const double v = std::trunc(static_cast<double>(a[i]) * factor);
    b[i] = v <= lo ? std::numeric_limits<T>::lowest() : v >= hi ? std::numeric_limits<T>::max() : static_cast<T>(v);
  }
}

void ScaleHalf(bool bf16, const void* in, void* out, int64_t n, double factor) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(out);
  const float f = static_cast<float>(factor);
  float buf[kHalfBlock];
  for (int64_t off = 0; off < n; off += kHalfBlock) {
    int64_t m = std::min(kHalfBlock, n - off);
    HalfToFloats(bf16, a + off, buf, m);
    for (int64_t i = 0; i < m; ++i) buf[i] *= f;
    FloatsToHalves(bf16, buf, b + off, m);
  }
}

}  // namespace

void InitReduceOps() {
  if (ops_ready) return;
  MPI_Op_create(&HalfReduce<false, ReduceOp::kSum>, 1, &half_ops[0][0]);
  MPI_Op_create(&HalfReduce<false, ReduceOp::kMin>, 1, &half_ops[0][1]);
  MPI_Op_create(&HalfReduce<false, ReduceOp::kMax>, 1, &half_ops[0][2]);
  MPI_Op_create(&HalfReduce<false, ReduceOp::kProd>, 1, &half_ops[0][3]);
  MPI_Op_create(&HalfReduce<true, ReduceOp::kSum>, 1, &half_ops[1][0]);
  MPI_Op_create(&HalfReduce<true, ReduceOp::kMin>, 1, &half_ops[1][1]);
  MPI_Op_create(&HalfReduce<true, ReduceOp::kMax>, 1, &half_ops[1][2]);
  MPI_Op_create(&HalfReduce<true, ReduceOp::kProd>, 1, &half_ops[1][3]);
  MPI_Op_create(&FloatMinMax<float, ReduceOp::kMin>, 1, &float_ops[0][0]);
  MPI_Op_create(&FloatMinMax<float, ReduceOp::kMax>, 1, &float_ops[0][1]);
  MPI_Op_create(&FloatMinMax<double, ReduceOp::kMin>, 1, &float_ops[1][0]);
  MPI_Op_create(&FloatMinMax<double, ReduceOp::kMax>, 1, &float_ops[1][1]);
  ops_ready = true;
}

void FreeReduceOps() {
  if (!ops_ready) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    for (auto& row : half_ops)
      for (auto& op : row) MPI_Op_free(&op);
    for (auto& row : float_ops)
      for (auto& op : row) MPI_Op_free(&op);
  }
  ops_ready = false;
}

MPI_Datatype MpiDatatype(DType d) {
  switch (d) {
    case DType::kBool: return MPI_UINT8_T;
    case DType::kInt8: return MPI_INT8_T;
    case DType::kInt16: return MPI_INT16_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kUInt8: return MPI_UINT8_T;
    case DType::kUInt16: return MPI_UINT16_T;
    case DType::kUInt32: return MPI_UINT32_T;
    case DType::kUInt64: return MPI_UINT64_T;
    case DType::kFloat16: case DType::kBFloat16: return MPI_UINT16_T;
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kComplex64: return MPI_C_FLOAT_COMPLEX;
    case DType::kComplex128: return MPI_C_DOUBLE_COMPLEX;
  }
  return MPI_BYTE;
}

MPI_Op MpiOp(DType d, ReduceOp op) {
  op = Reduction(op);
  if (d == DType::kFloat16) return half_ops[0][static_cast<int>(op)];
  if (d == DType::kBFloat16) return half_ops[1][static_cast<int>(op)];
  if ((d == DType::kFloat32 || d == DType::kFloat64) && (op == ReduceOp::kMin || op == ReduceOp::kMax))
    return float_ops[d == DType::kFloat64][op == ReduceOp::kMax];
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAverage: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProd: return MPI_PROD;
  }
  return MPI_SUM;
}

namespace {
template <typename T>
void FillWith(void* buf, int64_t n, T value) {
  std::fill_n(static_cast<T*>(buf), n, value);
}

template <typename T>
void FillNumeric(void* buf, int64_t n, ReduceOp op) {
  using L = std::numeric_limits<T>;
  if (op == ReduceOp::kProd) return FillWith<T>(buf, n, T(1));
  if constexpr (std::is_floating_point_v<T>) {
    FillWith<T>(buf, n, op == ReduceOp::kMin ? L::infinity() : -L::infinity());
  } else {
    FillWith<T>(buf, n, op == ReduceOp::kMin ? L::max() : L::lowest());
  }
}
}  // namespace

void FillIdentity(void* buf, int64_t n, DType d, ReduceOp op) {
  op = Reduction(op);
  if (op == ReduceOp::kSum || n == 0) {
    std::memset(buf, 0, n * ElementSize(d));  // zero is all-zero bits in every dtype
    return;
  }
  switch (d) {
    case DType::kBool: return FillWith<uint8_t>(buf, n, op == ReduceOp::kMax ? 0 : 1);
    case DType::kInt8: return FillNumeric<int8_t>(buf, n, op);
    case DType::kInt16: return FillNumeric<int16_t>(buf, n, op);
    case DType::kInt32: return FillNumeric<int32_t>(buf, n, op);
    case DType::kInt64: return FillNumeric<int64_t>(buf, n, op);
    case DType::kUInt8: return FillNumeric<uint8_t>(buf, n, op);
    case DType::kUInt16: return FillNumeric<uint16_t>(buf, n, op);
    case DType::kUInt32: return FillNumeric<uint32_t>(buf, n, op);
    case DType::kUInt64: return FillNumeric<uint64_t>(buf, n, op);
    case DType::kFloat32: return FillNumeric<float>(buf, n, op);
    case DType::kFloat64: return FillNumeric<double>(buf, n, op);
    case DType::kFloat16:
    case DType::kBFloat16: {
      const bool half = d == DType::kFloat16;
      const float v = op == ReduceOp::kProd ? 1.0f
                      : op == ReduceOp::kMin ? std::numeric_limits<float>::infinity()
                                             : -std::numeric_limits<float>::infinity();
      return FillWith<uint16_t>(buf, n, half ? FloatToHalf(v) : FloatToBFloat16(v));
    }
    case DType::kComplex64:  // only prod applies to complex values
      return FillWith<std::complex<float>>(buf, n, std::complex<float>(1, 0));
    case DType::kComplex128:
      return FillWith<std::complex<double>>(buf, n, std::complex<double>(1, 0));
  }
}

void Scale(const void* in, void* out, int64_t n, DType d, double factor) {
  switch (d) {
    case DType::kFloat32: return ScaleReal<float>(in, out, n, factor);
    case DType::kFloat64: return ScaleReal<double>(in, out, n, factor);
    case DType::kComplex64: return ScaleReal<float>(in, out, 2 * n, factor);
    case DType::kComplex128: return ScaleReal<double>(in, out, 2 * n, factor);
    case DType::kFloat16: return ScaleHalf(false, in, out, n, factor);
    case DType::kBFloat16: return ScaleHalf(true, in, out, n, factor);
    case DType::kInt8: return ScaleInteger<int8_t>(in, out, n, factor);
    case DType::kInt16: return ScaleInteger<int16_t>(in, out, n, factor);
    case DType::kInt32: return ScaleInteger<int32_t>(in, out, n, factor);
    case DType::kInt64: return ScaleInteger<int64_t>(in, out, n, factor);
    case DType::kUInt8: return ScaleInteger<uint8_t>(in, out, n, factor);
    case DType::kUInt16: return ScaleInteger<uint16_t>(in, out, n, factor);
    case DType::kUInt32: return ScaleInteger<uint32_t>(in, out, n, factor);
    case DType::kUInt64: return ScaleInteger<uint64_t>(in, out, n, factor);
    // Bools only reduce by min or max, unscaled (refused upstream otherwise).
    case DType::kBool:
      if (in != out) std::memcpy(out, in, n * ElementSize(d));
      return;
  }
}

}  // namespace jaxcache

namespace jaxcache {

void ReduceLocal(DType d, ReduceOp op, const void* in, void* inout, int64_t n) {
  switch (d) {
    case DType::kBool: case DType::kUInt8: return ReduceTyped<uint8_t>(op, in, inout, n);
    case DType::kInt8: return ReduceTyped<int8_t>(op, in, inout, n);
    case DType::kInt16: return ReduceTyped<int16_t>(op, in, inout, n);
    case DType::kInt32: return ReduceTyped<int32_t>(op, in, inout, n);
    case DType::kInt64: return ReduceTyped<int64_t>(op, in, inout, n);
    case DType::kUInt16: return ReduceTyped<uint16_t>(op, in, inout, n);
    case DType::kUInt32: return ReduceTyped<uint32_t>(op, in, inout, n);
    case DType::kUInt64: return ReduceTyped<uint64_t>(op, in, inout, n);
    case DType::kFloat32: return ReduceTyped<float>(op, in, inout, n);
    case DType::kFloat64: return ReduceTyped<double>(op, in, inout, n);
    case DType::kComplex64: return ReduceComplex<float>(op, in, inout, n);
    case DType::kComplex128: return ReduceComplex<double>(op, in, inout, n);
    case DType::kFloat16: return ReduceHalf(false, op, in, inout, n);
    case DType::kBFloat16: return ReduceHalf(true, op, in, inout, n);
  }
}

}  // namespace jaxcache
