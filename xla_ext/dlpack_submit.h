// The DLPack submit path: host arrays (eager JAX, PyTorch and TensorFlow
// tensors through DLPack, NumPy) become a Submission without a copy.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "eager_handle.h"

namespace jaxcache {

using InArray = nanobind::ndarray<nanobind::ro, nanobind::c_contig, nanobind::device::cpu>;
using OutArray = nanobind::ndarray<nanobind::c_contig, nanobind::device::cpu>;

// Caller-sized outputs (every kind but the allocated ones).
std::shared_ptr<Handle> SubmitArrays(int kind, const std::string& name,
                                     std::vector<InArray> inputs, std::vector<OutArray> outputs,
                                     int op, double prescale, double postscale, int root,
                                     std::vector<int> dtype_codes, bool refuse_if_in_flight,
                                     int device, int32_t process_set, int64_t world_size,
                                     bool drive);

// An allgather or alltoall whose outputs the executor allocates once the ranks
// have agreed on their sizes; read them with Handle.results().
std::shared_ptr<Handle> SubmitAllocated(int kind, const std::string& name, std::vector<InArray> inputs,
                                        std::vector<int64_t> splits, std::vector<int> dtype_codes,
                                        bool refuse_if_in_flight, int device, int32_t process_set,
                                        int64_t world_size, bool drive);

}  // namespace jaxcache
