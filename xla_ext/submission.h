// The one way a submission becomes a Request: XLA's custom calls, eager JAX
// calls and the torch/TensorFlow bridges all describe what they submit as a
// Submission, and MakeRequest checks it against the running runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "request.h"

namespace jaxcache {

class Runtime;

struct Submission {
  std::string name;
  int32_t process_set = 0;
  // The size of the set the caller prepared for (output shapes, a traced
  // program's 1/size); -1: not checked.
  int64_t world_size = -1;
  Signature sig;                      // sig.tensors: the operands
  std::vector<const void*> inputs;    // one per tensor
  // Caller-sized results, one per tensor (may alias inputs), with their sizes
  // in bytes; empty when the executor allocates them (allocate_outputs).
  std::vector<void*> outputs;
  std::vector<std::size_t> output_bytes;
  bool allocate_outputs = false;      // allgather / alltoall of agreed sizes
  bool refuse_if_in_flight = false;   // see Request
};

// A request ready to submit to `runtime`, or (request null) why not.
struct PreparedRequest {
  std::shared_ptr<Runtime> runtime;
  RequestPtr request;
  Status status;
};

PreparedRequest MakeRequest(Submission s);

// Why a request for `set` cannot run on `rank`.
std::string NotAMember(int32_t set, int rank);

}  // namespace jaxcache
