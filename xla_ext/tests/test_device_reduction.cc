// The local levels of a reduction over the devices (device_reduction.h): each
// device's block reduced over every device into its own result, then copied
// into the others'; a result aliased with its operand (XLA in place) included.
#include <cstdint>
#include <numeric>
#include <vector>

#include "check.h"
#include "device_reduction.h"

using namespace jaxcache;

TEST(DeviceReduction, BlocksCoverEveryElementOnce) {
  for (int64_t count : {0, 1, 2, 7, 9, 1000}) {
    for (int devices : {1, 2, 3, 4}) {
      int64_t next = 0;
      for (int p = 0; p < devices; ++p) {
        const Block b = BlockOf(count, devices, p);
        CHECK_EQ(b.first, next);
        CHECK(b.count == count / devices || b.count == count / devices + 1);
        next += b.count;
      }
      CHECK_EQ(next, count);
    }
  }
}

namespace {

// A request over `devices` devices of int32 tensors shaped `counts` (one each per
// device), device p's operand k holding value p * 100 + k * 10 + element index;
// device `aliased`'s results are its operands.
struct Fixture {
  std::vector<std::vector<int32_t>> in, out;
  Request r;
  Fixture(int devices, const std::vector<int64_t>& counts, ReduceOp op, int aliased) {
    r.sig.op = op;
    r.sig.devices = devices;
    r.sig.over_devices = true;
    for (int p = 0; p < devices; ++p)
      for (std::size_t k = 0; k < counts.size(); ++k) {
        std::vector<int32_t> v(counts[k]);
        std::iota(v.begin(), v.end(), p * 100 + static_cast<int32_t>(k) * 10);
        in.push_back(v);
        out.emplace_back(counts[k], -1);
        r.sig.tensors.push_back({DType::kInt32, {counts[k]}});
      }
    for (std::size_t t = 0; t < in.size(); ++t) {
      const bool alias = static_cast<int>(t / counts.size()) == aliased;
      r.inputs.push_back(in[t].data());
      r.outputs.push_back(alias ? in[t].data() : out[t].data());
    }
  }
  const int32_t* Result(std::size_t t) const { return static_cast<const int32_t*>(r.outputs[t]); }
};

}  // namespace

TEST(DeviceReduction, EveryDeviceGetsTheReductionOverAllDevices) {
  const std::vector<int64_t> counts{7, 2, 0};
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    for (int aliased : {-1, 0, 2}) {
      Fixture f(3, counts, op, aliased);
      ReduceBlocks(f.r);
      GatherBlocks(f.r);
      for (int p = 0; p < 3; ++p)
        for (std::size_t k = 0; k < counts.size(); ++k)
          for (int64_t i = 0; i < counts[k]; ++i) {
            const int32_t base = static_cast<int32_t>(k * 10 + i);
            const int32_t want = op == ReduceOp::kSum ? 3 * base + 300 : op == ReduceOp::kMax ? base + 200 : base;
            CHECK_EQ(f.Result(p * counts.size() + k)[i], want);
          }
    }
  }
}

TEST(DeviceReduction, OnlyRequestsOverSeveralDevicesTakeTheLocalLevels) {
  Fixture f(2, {4}, ReduceOp::kSum, -1);
  CHECK(ReducesOverDevices(f.r));
  f.r.sig.over_devices = false;
  CHECK(!ReducesOverDevices(f.r));
  Fixture one(1, {4}, ReduceOp::kSum, -1);
  CHECK(!ReducesOverDevices(one.r));
}
