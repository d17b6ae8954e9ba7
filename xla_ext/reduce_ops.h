// MPI datatypes and reduction operators for every dtype, including the
// half-precision types MPI does not know, and the scaling kernels.
#pragma once

#include <mpi.h>

#include <cstdint>

#include "common.h"

namespace jaxcache {

// Datatype used to move `dtype` (half types move as 16-bit words).
MPI_Datatype MpiDatatype(DType dtype);
// Operator reducing `dtype` with `op`; a user-defined operator for half types.
MPI_Op MpiOp(DType dtype, ReduceOp op);
// Creates the user-defined operators; call after MPI_Init, once.
void InitReduceOps();
void FreeReduceOps();

// inout[i] = op(in[i], inout[i]): the same bits as MPI's builtin operator (ours for the
// half types). Used where the runtime reduces by itself (the cycle's speculative payload).
void ReduceLocal(DType dtype, ReduceOp op, const void* in, void* inout, int64_t count);

// out[i] = in[i] * factor (in may equal out). Floating and complex dtypes only.
void Scale(const void* in, void* out, int64_t count, DType dtype, double factor);

// Fills `count` elements with the identity of `op`: what a rank adds when it
// contributes nothing (0 for sums, 1 for products, the largest value for min,
// the smallest for max; true / false for bool min / max).
void FillIdentity(void* buf, int64_t count, DType dtype, ReduceOp op);

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace jaxcache
