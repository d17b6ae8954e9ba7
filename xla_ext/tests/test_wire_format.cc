// Writer / Reader (common.h): the encoding of the control-plane messages
// that travel between ranks, and the decoder's checks on short input.
#include <cstdint>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "common.h"

using namespace jaxcache;

namespace {

// A signature with every field away from its default.
Signature EveryField() {
  Signature s;
  s.kind = Kind::kAlltoall;
  s.op = ReduceOp::kMax;
  s.prescale = 0.125;
  s.postscale = -3.5;
  s.root = 3;
  s.device = Device::kCuda;
  s.static_shapes = true;
  s.splits = {1, 0, 7};
  s.devices = 3;
  s.over_devices = true;
  s.tensors = {{DType::kBFloat16, {8, 2, 3}}, {DType::kComplex128, {}}, {DType::kUInt64, {0}}};
  return s;
}

std::vector<char> Encode(const Signature& s) {
  Writer w;
  w.Sig(s);
  return w.buffer();
}

}  // namespace

TEST(WireFormat, ScalarsAndStringsRoundTrip) {
  Writer w;
  w.U8(250);
  w.U32(0xdeadbeef);
  w.I32(-5);
  w.I64(std::numeric_limits<int64_t>::min());
  w.F64(0.1);
  w.Str("grad/layer1");
  w.Str("");
  Reader r(w.buffer().data(), w.buffer().size());
  CHECK_EQ(r.U8(), 250);
  CHECK_EQ(r.U32(), 0xdeadbeefu);
  CHECK_EQ(r.I32(), -5);
  CHECK_EQ(r.I64(), std::numeric_limits<int64_t>::min());
  CHECK_EQ(r.F64(), 0.1);
  CHECK_EQ(r.Str(), std::string("grad/layer1"));
  CHECK_EQ(r.Str(), std::string(""));
  CHECK(r.done());
  CHECK_EQ(r.remaining(), 0u);
}

TEST(WireFormat, SignatureRoundTripsEveryField) {
  const Signature s = EveryField();
  const std::vector<char> bytes = Encode(s);
  Reader r(bytes.data(), bytes.size());
  const Signature back = r.Sig();
  CHECK(back == s);
  CHECK(r.done());
  CHECK(Reader(bytes.data(), bytes.size()).Sig() != Signature());  // not trivially equal
}

TEST(WireFormat, SignaturesFollowEachOther) {
  Writer w;
  Signature a;
  a.tensors = {{DType::kFloat32, {4}}};
  w.Sig(a);
  w.Sig(EveryField());
  w.Str("tail");
  Reader r(w.buffer().data(), w.buffer().size());
  CHECK(r.Sig() == a);
  CHECK(r.Sig() == EveryField());
  CHECK_EQ(r.Str(), std::string("tail"));
}

// Every strict prefix of a message is refused, never read past its end.
TEST(WireFormat, TruncatedSignatureThrowsAtEveryLength) {
  const std::vector<char> bytes = Encode(EveryField());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<char> prefix(bytes.begin(), bytes.begin() + n);
    Reader r(prefix.data(), prefix.size());
    CHECK_THROWS(r.Sig());
  }
}

TEST(WireFormat, TruncatedStringThrows) {
  Writer w;
  w.Str("hello");
  std::vector<char> bytes = w.buffer();
  bytes.pop_back();
  Reader r(bytes.data(), bytes.size());
  CHECK_THROWS(r.Str());
  Reader empty(nullptr, 0);
  CHECK(empty.done());
  CHECK_THROWS(empty.U32());
}

TEST(WireFormat, ImpossibleSplitCountIsRefusedBeforeAllocating) {
  // A signature header whose split count claims more entries than the bytes left.
  Writer w;
  w.U8(0);
  w.U8(0);
  w.F64(1);
  w.F64(1);
  w.I32(0);
  w.U8(0);
  w.U8(0);
  w.U32(0xffffffffu);
  Reader r(w.buffer().data(), w.buffer().size());
  CHECK_THROWS(r.Sig());
}

namespace {
// The bytes of a signature header up to (not including) its tensor count.
Writer HeaderWithoutTensors(uint8_t kind, uint8_t op, uint8_t device) {
  Writer w;
  w.U8(kind);
  w.U8(op);
  w.F64(1);
  w.F64(1);
  w.I32(0);
  w.U8(device);
  w.U8(0);
  w.U32(0);  // no splits
  w.I32(1);  // one device
  w.U8(0);   // not reduced over the devices
  return w;
}
}  // namespace

TEST(WireFormat, ImpossibleTensorCountIsRefusedBeforeAllocating) {
  // 2^32 - 1 tensors claimed in a few bytes: refused as truncated, not ~128 GiB resized.
  Writer w = HeaderWithoutTensors(0, 0, 0);
  w.U32(0xffffffffu);
  Reader r(w.buffer().data(), w.buffer().size());
  bool truncated = false;
  try {
    r.Sig();
  } catch (const std::bad_alloc&) {  // (a bad_alloc is a runtime_error's sibling: not this)
  } catch (const std::runtime_error&) {
    truncated = true;
  }
  CHECK(truncated);
}

TEST(WireFormat, CodesOutOfRangeAreRefused) {
  const uint8_t bad = 200;
  for (int field = 0; field < 4; ++field) {
    Writer w = HeaderWithoutTensors(field == 0 ? bad : 0, field == 1 ? bad : 0, field == 2 ? bad : 0);
    w.U32(1);
    w.U8(field == 3 ? bad : 0);  // the tensor's dtype
    w.U8(0);                     // a scalar
    Reader r(w.buffer().data(), w.buffer().size());
    CHECK_THROWS(r.Sig());
  }
  // The same bytes with valid codes decode.
  Writer ok = HeaderWithoutTensors(0, 0, 0);
  ok.U32(1);
  ok.U8(0);
  ok.U8(0);
  Reader r(ok.buffer().data(), ok.buffer().size());
  CHECK_EQ(r.Sig().tensors.size(), 1u);
}

TEST(WireFormat, DeviceCountBelowOneIsRefused) {
  for (int32_t devices : {0, -4}) {
    Writer w;
    Signature s;
    s.devices = devices;
    w.Sig(s);
    Reader r(w.buffer().data(), w.buffer().size());
    CHECK_THROWS(r.Sig());
  }
}
