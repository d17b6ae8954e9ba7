// Point-to-point messages (send, recv, sendrecv): not negotiated by the
// cycles, but matched by MPI itself on (peer, tag) over channels of their own.
//
// Order: MPI pairs the k-th send from a to b on a tag with the k-th receive b
// posts for it. jaxcache/ops/point_to_point.py makes a rank's sends and
// receives one ordered JAX effect, so XLA starts them in program order (the
// one order every rank agrees on), while collectives and computation stay
// independent of them.
//
// Wire: each message is a header (dtype, shape, name) sent with MPI_Issend on
// the header channel; a payload up to kP2PInlineBytes rides inside it (one
// message), a larger one follows on the data channel straight from XLA's
// buffer into the receiver's. The receiver checks the header against what it
// expects before any payload lands (a mismatch is a MismatchError there, the
// payload drained). A send completes for XLA like MPI's standard mode: a
// buffered (inline) one at once, a larger one when its data has been taken.
// The header is a synchronous send (MPI_Issend): the engine keeps it until it
// has been received, so a send that nobody receives is reported (stall inspection).
//
// Progress: the submitting thread posts the MPI calls and polls them for up
// to JAXCACHE_INLINE_SPIN_US (a peer that is ready completes the op on that
// thread, no hand-off); what is left goes to one progress thread that polls
// with backoff (up to 1 ms between polls) while anything is pending, and
// sleeps otherwise.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <map>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "config.h"
#include "request.h"

namespace jaxcache {

class CompletionQueue;
class ProcessSet;

// MPI's wildcards, as the API takes them (exported to Python by the module).
constexpr int kAnySource = MPI_ANY_SOURCE;
constexpr int kAnyTag = MPI_ANY_TAG;

// Payloads up to this size travel inside their header message.
constexpr std::size_t kP2PInlineBytes = 16 << 10;
constexpr int kP2PMaxDims = 16;

// A process set's point-to-point channels: duplicates of its communicator (so
// user tags are used as they are, and never match the cycles' traffic).
class P2PChannels {
 public:
  explicit P2PChannels(MPI_Comm comm);
  ~P2PChannels();
  P2PChannels(const P2PChannels&) = delete;
  P2PChannels& operator=(const P2PChannels&) = delete;
  MPI_Comm header() const { return header_; }
  MPI_Comm data() const { return data_; }
  int tag_ub() const { return tag_ub_; }

 private:
  MPI_Comm header_ = MPI_COMM_NULL, data_ = MPI_COMM_NULL;
  int tag_ub_ = 32767;
};

// The header of one message (trivially copyable; both ends run the same build).
struct P2PHeader {
  static constexpr uint32_t kMagic = 0x6a633270;  // "jc2p"
  uint32_t magic = kMagic;
  uint8_t dtype = 0;
  uint8_t ndim = 0;
  uint8_t payload_inline = 0;
  uint8_t name_bytes = 0;
  uint64_t payload_bytes = 0;
  int64_t dims[kP2PMaxDims] = {};
  char name[96] = {};
};

// One send, receive or both (sendrecv), from its start to its completion.
struct P2POp {
  std::string name;
  std::shared_ptr<ProcessSet> set;  // keeps the channels alive
  int rank = 0;
  // Sending side (dest >= 0).
  int dest = -1, send_tag = 0;
  const void* send_data = nullptr;
  std::unique_ptr<char[]> send_msg;  // the header, and the payload when inline
  std::size_t send_msg_bytes = 0;
  uint64_t send_bytes = 0;
  bool buffered() const { return send_msg_bytes > sizeof(P2PHeader) || send_bytes == 0; }
  // Receiving side (has_recv).
  bool has_recv = false;
  int source = kAnySource, recv_tag = kAnyTag;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  void* recv_data = nullptr;
  uint64_t recv_bytes = 0;
  MPI_Status* user_status = nullptr;  // filled on success (mpi4py's Status), may be null
  std::unique_ptr<char[]> recv_msg;  // header + kP2PInlineBytes (uninitialised)
  std::vector<char> drain;
  int from = -1, got_tag = -1;  // the actual source and tag of the message received
  // Progress.
  enum Slot { kSendHeader, kSendData, kRecvHeader, kRecvData, kSlots };
  MPI_Request reqs[kSlots] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  Status outcome;
  Clock::time_point started{};
  bool warned = false;
  Completion done;

  std::string Describe() const;  // "send 'x' from rank 0 to rank 1 (tag 3)", ...
};

// The runtime's point-to-point engine (one per process).
class PointToPoint {
 public:
  PointToPoint(const Config& config, CompletionQueue& completions);
  ~PointToPoint();  // Stop()s
  // Posts the op's messages and drives it for up to inline_spin_us on the
  // calling thread; completes it there or hands it to the progress thread.
  void Start(std::unique_ptr<P2POp> op);
  // Fails what is still pending with `why` (its receives cancelled) and ends
  // the progress thread; later Start()s fail with `why`.
  void Stop(const Status& why);
  // The failure of the last op named `name` that failed, taken (eager calls
  // raise its class); kNone if none is recorded.
  Status TakeFailure(const std::string& name);
  void RecordFailure(const std::string& name, const Status& status);

 private:
  void Loop();
  // Posts the first MPI calls; false (and op.outcome set) when MPI refused.
  bool Post(P2POp& op);
  // Tests the op's requests, handles an arrived header; true once done.
  bool Progress(P2POp& op);
  void OnHeader(P2POp& op, const MPI_Status& st);
  void Fail(P2POp& op, ErrorKind kind, std::string message);
  // Cancels what the op still waits for (an abandoned or stalled op); false
  // when MPI did not let go of it in time (its buffers must then stay alive).
  bool Cancel(P2POp& op);
  void Inspect(P2POp& op, Clock::time_point now);
  // XLA may be told: what it waits for has completed (a buffered send's
  // delivery may still be under way).
  static bool Answerable(const P2POp& op);
  // A large payload is moving between the two ranks (worth driving inline).
  static bool Transferring(const P2POp& op);
  // Runs the op's completion, once: here (`here`) or on the completion thread.
  void Answer(P2POp& op, bool here);
  // Gives up on an op (stalled, or the engine stops): cancelled and answered.
  void Abandon(std::unique_ptr<P2POp> op);

  const Config& config_;
  CompletionQueue& completions_;
  // Answered buffered sends whose delivery is not confirmed yet: reaped by
  // later Start()s and every kLingerPoll by the progress thread (not a wake-up
  // per message), and inspected for stalls.
  void Reap(bool inspect);
  bool Lingering();

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<P2POp>> incoming_;
  bool idle_ = false;  // the progress thread waits without a timeout
  std::mutex linger_mu_;
  std::vector<std::unique_ptr<P2POp>> lingering_;
  std::mutex failures_mu_;
  std::map<std::string, Status> failures_;  // bounded (kMaxFailures)
  bool stopping_ = false;
  Status stopped_;
  std::thread thread_;
};

}  // namespace jaxcache
