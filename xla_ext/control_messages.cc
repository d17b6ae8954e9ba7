#include "control_messages.h"

#include <memory>
#include <stdexcept>

namespace jaxcache {

void WriteRequestEntry(Writer& w, const std::string& name, uint64_t seq, const Signature& sig) {
  w.Str(name);
  w.I64(static_cast<int64_t>(seq));
  w.Sig(sig);
}

RequestEntry ReadRequestEntry(Reader& rd) {
  RequestEntry e;
  e.name = rd.Str();
  e.seq = static_cast<uint64_t>(rd.I64());
  e.sig = rd.Sig();
  return e;
}

void WriteResponse(Writer& w, const Response& resp) {
  w.Str(resp.name);
  w.I64(static_cast<int64_t>(resp.seq));
  w.U8(static_cast<uint8_t>(resp.status.kind));
  w.Str(resp.status.message);
  w.Sig(resp.sig);
  w.U8(resp.agreement ? 1 : 0);
  if (resp.agreement) {
    w.U8(resp.agreement->static_shapes ? 1 : 0);
    w.U32(static_cast<uint32_t>(resp.agreement->rows.size()));
    for (int64_t v : resp.agreement->rows) w.I64(v);
  }
}

Response ReadResponse(Reader& rd) {
  Response resp;
  resp.name = rd.Str();
  resp.seq = static_cast<uint64_t>(rd.I64());
  resp.status.kind = static_cast<ErrorKind>(rd.U8());
  resp.status.message = rd.Str();
  resp.sig = rd.Sig();
  if (rd.U8()) {
    auto agreement = std::make_shared<Agreement>();
    agreement->static_shapes = rd.U8() != 0;
    uint32_t n = rd.U32();
    if (n > rd.remaining() / sizeof(int64_t)) throw std::runtime_error("jaxcache: truncated control message");
    agreement->rows.resize(n);
    for (auto& v : agreement->rows) v = rd.I64();
    resp.agreement = std::move(agreement);
  }
  return resp;
}

std::vector<char> EncodeCancelReport(const CancelReport& report) {
  Writer w;
  w.Str(report.fault);
  w.U32(static_cast<uint32_t>(report.pending.size()));
  for (const auto& [name, seq] : report.pending) {
    w.Str(name);
    w.I64(static_cast<int64_t>(seq));
  }
  return std::move(w.buffer());
}

CancelReport DecodeCancelReport(const std::vector<char>& bytes) {
  Reader rd(bytes.data(), bytes.size());
  CancelReport report;
  report.fault = rd.Str();
  const uint32_t n = rd.U32();
  for (uint32_t i = 0; i < n; ++i) {
    std::string name = rd.Str();
    report.pending.emplace_back(std::move(name), static_cast<uint64_t>(rd.I64()));
  }
  return report;
}

std::vector<char> EncodeCancelDecision(const CancelDecision& decision) {
  Writer w;
  w.U8(static_cast<uint8_t>(decision.why.kind));
  w.Str(decision.why.message);
  w.U32(static_cast<uint32_t>(decision.upto.size()));
  for (const auto& [name, seq] : decision.upto) {
    w.Str(name);
    w.I64(static_cast<int64_t>(seq));
  }
  return std::move(w.buffer());
}

CancelDecision DecodeCancelDecision(const std::vector<char>& bytes) {
  Reader rd(bytes.data(), bytes.size());
  CancelDecision decision;
  decision.why.kind = static_cast<ErrorKind>(rd.U8());
  decision.why.message = rd.Str();
  const uint32_t n = rd.U32();
  for (uint32_t i = 0; i < n; ++i) {
    std::string name = rd.Str();
    decision.upto[name] = static_cast<uint64_t>(rd.I64());
  }
  return decision;
}

}  // namespace jaxcache
