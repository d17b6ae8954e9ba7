// DeviceRendezvous and JoinParts (device_parts.h): the executions of one
// collective on the devices of one run meet, whatever their order, and leave
// as one submission in device-position order.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "device_parts.h"

using namespace jaxcache;

namespace {

// Device `position`'s part: one float32 tensor of `rows` rows; its completion
// records the status it got in `outcome[position]`.
DevicePart Part(int position, int64_t rows, std::vector<std::string>* outcome) {
  DevicePart p;
  p.position = position;
  p.submission.name = "x";
  p.submission.sig.tensors.push_back({DType::kFloat32, {rows}});
  p.submission.inputs.push_back(reinterpret_cast<const void*>(0x1000 + position));
  p.submission.outputs.push_back(reinterpret_cast<void*>(0x2000 + position));
  p.submission.output_bytes.push_back(rows * 4);
  p.done = Completion([outcome, position](const Status& st) { (*outcome)[position] = st.ok() ? "ok" : st.message; },
                      /*cheap=*/true);
  return p;
}

const void* const kSite = reinterpret_cast<const void*>(0x10);

}  // namespace

TEST(DeviceRendezvous, SetCompletesWithTheLastDeviceInPositionOrder) {
  DeviceRendezvous r;
  std::vector<std::string> outcome(3);
  CHECK(r.Arrive(kSite, 7, 3, Part(2, 4, &outcome)).empty());
  CHECK(r.Arrive(kSite, 7, 3, Part(0, 4, &outcome)).empty());
  CHECK_EQ(r.waiting(), 1u);
  std::vector<DevicePart> parts = r.Arrive(kSite, 7, 3, Part(1, 4, &outcome));
  CHECK_EQ(parts.size(), 3u);
  CHECK_EQ(r.waiting(), 0u);
  for (int p = 0; p < static_cast<int>(parts.size()); ++p) CHECK_EQ(parts[p].position, p);
  Submission joined;
  CHECK(JoinParts(parts, joined).ok());
  CHECK_EQ(joined.sig.devices, 3);
  CHECK_EQ(joined.sig.tensors.size(), 3u);
  for (int p = 0; p < 3; ++p) {
    CHECK(joined.inputs[p] == reinterpret_cast<const void*>(0x1000 + p));
    CHECK(joined.outputs[p] == reinterpret_cast<void*>(0x2000 + p));
  }
  CompletionOfAll(parts).Run(Status::Ok());
  CHECK(outcome == (std::vector<std::string>{"ok", "ok", "ok"}));
}

TEST(DeviceRendezvous, RunsAndSitesAreKeptApart) {
  DeviceRendezvous r;
  std::vector<std::string> outcome(2);
  const void* other_site = reinterpret_cast<const void*>(0x20);
  CHECK(r.Arrive(kSite, 1, 2, Part(0, 4, &outcome)).empty());
  CHECK(r.Arrive(kSite, 2, 2, Part(1, 4, &outcome)).empty());       // another run
  CHECK(r.Arrive(other_site, 1, 2, Part(1, 4, &outcome)).empty());  // another instruction
  CHECK_EQ(r.waiting(), 3u);
  CHECK_EQ(r.Arrive(kSite, 1, 2, Part(1, 4, &outcome)).size(), 2u);
  CHECK_EQ(r.Arrive(kSite, 2, 2, Part(0, 4, &outcome)).size(), 2u);
  CHECK_EQ(r.Arrive(other_site, 1, 2, Part(0, 4, &outcome)).size(), 2u);
  CHECK_EQ(r.waiting(), 0u);
}

// A loop runs the same instruction again in one run: a device's next
// execution belongs to the next set, even while the first is incomplete.
TEST(DeviceRendezvous, RepeatedExecutionsOfOneRunFillSetsInOrder) {
  DeviceRendezvous r;
  std::vector<std::string> outcome(2);
  CHECK(r.Arrive(kSite, 5, 2, Part(0, 1, &outcome)).empty());
  CHECK(r.Arrive(kSite, 5, 2, Part(0, 2, &outcome)).empty());
  CHECK_EQ(r.waiting(), 2u);
  std::vector<DevicePart> first = r.Arrive(kSite, 5, 2, Part(1, 1, &outcome));
  CHECK_EQ(first.size(), 2u);
  CHECK_EQ(first[0].submission.sig.tensors[0].shape[0], 1);
  std::vector<DevicePart> second = r.Arrive(kSite, 5, 2, Part(1, 2, &outcome));
  CHECK_EQ(second.size(), 2u);
  CHECK_EQ(second[0].submission.sig.tensors[0].shape[0], 2);
}

// A part that cannot say where it belongs still completes its set, failed:
// no device waits forever for it.
TEST(DeviceRendezvous, MisplacedOrFailedPartFailsTheWholeSet) {
  DeviceRendezvous r;
  std::vector<std::string> outcome(2);
  CHECK(r.Arrive(kSite, 9, 2, Part(0, 4, &outcome)).empty());
  DevicePart lost = Part(1, 4, &outcome);
  lost.position = 5;
  std::vector<DevicePart> parts = r.Arrive(kSite, 9, 2, std::move(lost));
  CHECK_EQ(parts.size(), 2u);
  Submission joined;
  const Status st = JoinParts(parts, joined);
  CHECK(!st.ok());
  CHECK(st.message.find("device position 5") != std::string::npos);
  CompletionOfAll(parts).Run(st);
  CHECK(outcome[0] != "ok" && outcome[1] != "ok");

  std::vector<std::string> outcome2(2);
  DevicePart bad = Part(1, 4, &outcome2);
  bad.status = Status::Error(ErrorKind::kInvalidArgument, "jaxcache: unsupported dtype");
  CHECK(r.Arrive(kSite, 10, 2, std::move(bad)).empty());
  parts = r.Arrive(kSite, 10, 2, Part(0, 4, &outcome2));
  const Status failed = JoinParts(parts, joined);
  CHECK(failed.kind == ErrorKind::kInvalidArgument);
  CHECK(failed.message.find("unsupported dtype (device position 1 of 2)") != std::string::npos);
  CompletionOfAll(parts).Run(failed);
  CHECK(outcome2[0] == failed.message && outcome2[1] == failed.message);
}

TEST(DeviceRendezvous, ConcurrentArrivalsCompleteEverySetOnce) {
  DeviceRendezvous r;
  constexpr int kDevices = 4, kRuns = 200;
  std::vector<std::string> outcome(kDevices);
  std::atomic<int> sets{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < kDevices; ++p)
    threads.emplace_back([&, p] {
      for (int run = 0; run < kRuns; ++run) {
        std::vector<DevicePart> parts = r.Arrive(kSite, run, kDevices, Part(p, 4, &outcome));
        if (parts.empty()) continue;
        ++sets;
        for (int q = 0; q < kDevices; ++q) CHECK_EQ(parts[q].position, q);
      }
    });
  for (auto& t : threads) t.join();
  CHECK_EQ(sets.load(), kRuns);
  CHECK_EQ(r.waiting(), 0u);
}

// A set that waits for a device which never runs the collective: a warning
// naming the missing positions once past the check time, its parts failed
// with a StallError past the shutdown time; nothing before.
TEST(DeviceRendezvous, WaitingSetsAreReportedThenFailed) {
  std::vector<std::string> outcome(3);  // outlives the rendezvous, which completes what still waits
  DeviceRendezvous r;
  const StallLimits limits{.check_s = 10, .shutdown_s = 30};
  CHECK(r.Arrive(kSite, 3, 3, Part(1, 4, &outcome), limits).empty());
  const Clock::time_point start = Clock::now();
  std::vector<DevicePart> expired;
  CHECK(r.Inspect(start, &expired).empty());
  std::vector<std::string> warnings = r.Inspect(start + std::chrono::seconds(11), &expired);
  CHECK_EQ(warnings.size(), 1u);
  CHECK(!warnings.empty() && warnings[0].find("'x' waits for device positions 0, 2 of 3") != std::string::npos);
  CHECK(r.Inspect(start + std::chrono::seconds(12), &expired).empty());  // once
  CHECK(expired.empty());
  r.Inspect(start + std::chrono::seconds(31), &expired);
  CHECK_EQ(expired.size(), 1u);
  CHECK_EQ(r.waiting(), 0u);
  for (auto& p : expired) p.done.Run(p.status);
  CHECK(outcome[1].find("waits for device positions 0, 2 of 3") != std::string::npos);
  // Without a shutdown time a set only warns.
  CHECK(r.Arrive(kSite, 4, 2, Part(0, 4, &outcome), StallLimits{.check_s = 1, .shutdown_s = 0}).empty());
  CHECK_EQ(r.Inspect(Clock::now() + std::chrono::hours(1), &expired).size(), 1u);
  CHECK_EQ(r.waiting(), 1u);
}

// Shutdown takes every waiting part out, and waits for the device threads to
// finish what they run (no program continues on them while the process exits).
TEST(DeviceRendezvous, ShutdownTakesWaitingPartsAndDrainsTheDeviceThreads) {
  std::vector<std::string> outcome(2);
  DeviceRendezvous r;
  CHECK(r.Arrive(kSite, 77, 2, Part(0, 4, &outcome)).empty());
  std::vector<DevicePart> taken = r.TakeAll();
  CHECK_EQ(taken.size(), 1u);
  CHECK_EQ(r.waiting(), 0u);
  for (auto& p : taken) p.done.Run(Status::Error(ErrorKind::kShutdown, "jaxcache: shut down"));
  CHECK_EQ(outcome[0], std::string("jaxcache: shut down"));

  std::atomic<int> ran{0};
  for (int p = 0; p < 3; ++p)
    DeviceThreads::Get().Post(p, [&ran] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ++ran;
    });
  CHECK(DeviceThreads::Get().Drain(std::chrono::seconds(10)));
  CHECK_EQ(ran.load(), 3);
}
