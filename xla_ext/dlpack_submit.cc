#include "dlpack_submit.h"

#include <stdexcept>

#include "collectives/collective.h"

namespace nb = nanobind;

namespace jaxcache {

namespace {

DType FromDlpack(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  auto code = static_cast<C>(t.code);
  if (t.lanes != 1) throw std::invalid_argument("jaxcache: vector dtypes are not supported");
  switch (code) {
    case C::Bool: return DType::kBool;
    case C::Int:
      switch (t.bits) {
        case 8: return DType::kInt8; case 16: return DType::kInt16;
        case 32: return DType::kInt32; case 64: return DType::kInt64;
      }
      break;
    case C::UInt:
      switch (t.bits) {
        case 8: return DType::kUInt8; case 16: return DType::kUInt16;
        case 32: return DType::kUInt32; case 64: return DType::kUInt64;
      }
      break;
    case C::Float:
      switch (t.bits) {
        case 16: return DType::kFloat16; case 32: return DType::kFloat32; case 64: return DType::kFloat64;
      }
      break;
    case C::Bfloat:
      if (t.bits == 16) return DType::kBFloat16;
      break;
    case C::Complex:
      switch (t.bits) {
        case 64: return DType::kComplex64; case 128: return DType::kComplex128;
      }
      break;
    default: break;
  }
  throw std::invalid_argument("jaxcache: unsupported dtype (code " + std::to_string(t.code) +
                              ", " + std::to_string(t.bits) + " bits)");
}

TensorSpec Spec(const InArray& a, const std::vector<int>& dtype_codes, std::size_t i) {
  TensorSpec spec;
  // An explicit code covers dtypes a producer cannot export (NumPy's bfloat16).
  spec.dtype = i < dtype_codes.size() && dtype_codes[i] >= 0 ? static_cast<DType>(dtype_codes[i])
                                                            : FromDlpack(a.dtype());
  for (std::size_t d = 0; d < a.ndim(); ++d) spec.shape.push_back(a.shape(d));
  return spec;
}

// Codes from Python are the exported enums' values (jaxcache.protocol); anything
// else is refused before a request exists.
template <typename E>
E Checked(int code, int count, const char* what) {
  if (code < 0 || code >= count)
    throw std::invalid_argument(std::string("jaxcache: unknown ") + what + " " + std::to_string(code));
  return static_cast<E>(code);
}

Submission FromArrays(int kind, const std::string& name, const std::vector<InArray>& inputs,
                      const std::vector<int>& dtype_codes, bool refuse_if_in_flight, int device,
                      int32_t process_set, int64_t world_size) {
  Submission s;
  s.name = name;
  s.process_set = process_set;
  s.world_size = world_size;
  s.sig.kind = Checked<Kind>(kind, kNumKinds, "collective kind");
  // The buffers are host memory (a bridge staged device tensors already);
  // the device kind only has to agree across ranks.
  s.sig.device = Checked<Device>(device, kNumDevices, "device kind");
  s.refuse_if_in_flight = refuse_if_in_flight;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    s.sig.tensors.push_back(Spec(inputs[i], dtype_codes, i));
    s.inputs.push_back(inputs[i].data());
  }
  return s;
}

}  // namespace

std::shared_ptr<Handle> SubmitAllocated(int kind, const std::string& name, std::vector<InArray> inputs,
                                        std::vector<int64_t> splits, std::vector<int> dtype_codes,
                                        bool refuse_if_in_flight, int device, int32_t process_set,
                                        int64_t world_size, bool drive) {
  Submission s = FromArrays(kind, name, inputs, dtype_codes, refuse_if_in_flight, device,
                            process_set, world_size);
  s.sig.splits = std::move(splits);
  s.allocate_outputs = true;
  return Track(std::move(s), false, drive);
}

std::shared_ptr<Handle> SubmitArrays(int kind, const std::string& name,
                                     std::vector<InArray> inputs, std::vector<OutArray> outputs,
                                     int op, double prescale, double postscale, int root,
                                     std::vector<int> dtype_codes, bool refuse_if_in_flight,
                                     int device, int32_t process_set, int64_t world_size,
                                     bool drive) {
  Submission s = FromArrays(kind, name, inputs, dtype_codes, refuse_if_in_flight, device,
                            process_set, world_size);
  s.sig.op = Checked<ReduceOp>(op, kNumReduceOps, "reduce op");
  s.sig.prescale = prescale;
  s.sig.postscale = postscale;
  s.sig.root = root;
  // Caller-sized outputs: the ranks must agree on equal shapes (blocks).
  s.sig.static_shapes = CollectiveOf(s.sig.kind).AgreedSizes();
  for (auto& o : outputs) {
    s.outputs.push_back(o.data());
    s.output_bytes.push_back(o.size() * o.itemsize());
  }
  return Track(std::move(s), false, drive);
}

}  // namespace jaxcache
