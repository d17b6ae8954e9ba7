// The messages of the coordinator round and the cancel round, defined once:
// what each rank sends to rank 0 and what rank 0 broadcasts back. The cycle's
// own message is cycle_message.h; the primitive encoding is Writer/Reader.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "request.h"

namespace jaxcache {

// Coordinator round, to rank 0: a rank's uncached requests, one entry each.
struct RequestEntry {
  std::string name;
  uint64_t seq = 0;
  Signature sig;
};
void WriteRequestEntry(Writer& w, const std::string& name, uint64_t seq, const Signature& sig);
RequestEntry ReadRequestEntry(Reader& rd);

// Coordinator round, from rank 0: a first byte (kDecided, or kUndecided when
// rank 0 failed to match: every rank still takes part in the broadcast), then
// one Response per name decided.
constexpr uint8_t kUndecided = 0, kDecided = 1;
void WriteResponse(Writer& w, const Response& resp);
Response ReadResponse(Reader& rd);

// Cancel round, to rank 0: this rank's fault (empty if none) and every
// request it has pending, as (name, seq).
struct CancelReport {
  std::string fault;
  std::vector<std::pair<std::string, uint64_t>> pending;
};
std::vector<char> EncodeCancelReport(const CancelReport& report);
CancelReport DecodeCancelReport(const std::vector<char>& bytes);

// Cancel round, from rank 0: the status every cancelled request fails with,
// and per name the last submission cancelled.
struct CancelDecision {
  Status why;
  std::map<std::string, uint64_t> upto;
};
std::vector<char> EncodeCancelDecision(const CancelDecision& decision);
CancelDecision DecodeCancelDecision(const std::vector<char>& bytes);

}  // namespace jaxcache
