// The coordinator round's and the cancel round's messages (control_messages.h):
// every field survives a round trip, entries follow each other, and short
// input throws instead of reading past the end.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "control_messages.h"

using namespace jaxcache;

namespace {

Signature Allgather() {
  Signature s;
  s.kind = Kind::kAllgather;
  s.devices = 2;
  s.tensors = {{DType::kFloat32, {3, 4}}, {DType::kInt8, {}}};
  return s;
}

}  // namespace

TEST(ControlMessages, RequestEntriesRoundTripInOrder) {
  Writer w;
  WriteRequestEntry(w, "grads/0of2", 7, Allgather());
  WriteRequestEntry(w, "", 0, Signature());
  Reader rd(w.buffer().data(), w.buffer().size());
  RequestEntry a = ReadRequestEntry(rd), b = ReadRequestEntry(rd);
  CHECK(rd.done());
  CHECK_EQ(a.name, std::string("grads/0of2"));
  CHECK_EQ(a.seq, uint64_t(7));
  CHECK(a.sig == Allgather());
  CHECK_EQ(b.name, std::string(""));
  CHECK(b.sig == Signature());
}

TEST(ControlMessages, ResponseRoundTripsStatusAndAgreement) {
  Response r;
  r.name = "x";
  r.seq = 3;
  r.status = Status::Error(ErrorKind::kMismatch, "shape differs");
  r.sig = Allgather();
  auto agreement = std::make_shared<Agreement>();
  agreement->static_shapes = true;
  agreement->rows = {2, 0, 5};
  r.agreement = agreement;
  Response plain;
  plain.name = "y";
  Writer w;
  WriteResponse(w, r);
  WriteResponse(w, plain);
  Reader rd(w.buffer().data(), w.buffer().size());
  Response got = ReadResponse(rd), got_plain = ReadResponse(rd);
  CHECK(rd.done());
  CHECK_EQ(got.name, r.name);
  CHECK_EQ(got.seq, r.seq);
  CHECK(got.status.kind == ErrorKind::kMismatch);
  CHECK_EQ(got.status.message, r.status.message);
  CHECK(got.sig == r.sig);
  CHECK(got.agreement && got.agreement->static_shapes);
  CHECK(got.agreement->rows == agreement->rows);
  CHECK(!got_plain.agreement);
  CHECK(got_plain.status.ok());
}

TEST(ControlMessages, TruncatedResponseThrowsAtEveryLength) {
  Response r;
  r.name = "z";
  r.sig = Allgather();
  auto agreement = std::make_shared<Agreement>();
  agreement->rows = {1, 2};
  r.agreement = agreement;
  Writer w;
  WriteResponse(w, r);
  const std::vector<char>& bytes = w.buffer();
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    Reader rd(bytes.data(), n);
    CHECK_THROWS(ReadResponse(rd));
  }
}

TEST(ControlMessages, CancelReportAndDecisionRoundTrip) {
  CancelReport report;
  report.fault = "rank 1: decoding (injected fault)";
  report.pending = {{"a", 4}, {"b", 0}};
  CancelReport got = DecodeCancelReport(EncodeCancelReport(report));
  CHECK_EQ(got.fault, report.fault);
  CHECK(got.pending == report.pending);
  CHECK(DecodeCancelReport(EncodeCancelReport(CancelReport())).pending.empty());

  CancelDecision decision;
  decision.why = Status::Error(ErrorKind::kStall, "stalled: 'a' missing on rank 2");
  decision.upto = {{"a", 4}, {"b", 9}};
  CancelDecision back = DecodeCancelDecision(EncodeCancelDecision(decision));
  CHECK(back.why.kind == ErrorKind::kStall);
  CHECK_EQ(back.why.message, decision.why.message);
  CHECK(back.upto == decision.upto);
}

TEST(ControlMessages, TruncatedCancelMessagesThrow) {
  CancelReport report;
  report.pending = {{"name", 1}};
  const std::vector<char> bytes = EncodeCancelReport(report);
  for (std::size_t n = 0; n < bytes.size(); ++n)
    CHECK_THROWS(DecodeCancelReport(std::vector<char>(bytes.begin(), bytes.begin() + n)));
  CancelDecision decision;
  decision.upto = {{"name", 1}};
  const std::vector<char> dbytes = EncodeCancelDecision(decision);
  for (std::size_t n = 0; n < dbytes.size(); ++n)
    CHECK_THROWS(DecodeCancelDecision(std::vector<char>(dbytes.begin(), dbytes.begin() + n)));
}
