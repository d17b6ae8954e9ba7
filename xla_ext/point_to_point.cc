#include "point_to_point.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "completion_queue.h"
#include "process_set.h"

namespace jaxcache {

using std::chrono::microseconds;

namespace {
// How the progress thread waits between polls once nothing moved: from
// kFirstPause doubling up to kLongestPause (a stalled peer costs at most
// ~1000 cheap wake-ups a second, only while something is pending).
constexpr microseconds kFirstPause{20};
constexpr microseconds kLongestPause{1000};
// How long a cancelled op may take to let go of its buffers.
constexpr std::chrono::seconds kCancelGrace{2};
// Once a large payload is moving (its header matched), the submitter keeps
// driving it for up to this long plus kTransferPerMiB per MiB: the transfer
// finishes soon, and a hand-off would add a wake-up and a poll pause to it
// (65536-float ping-pong at 2 ranks: 2.1-2.8x mpi4jax handed over, 0.8-1.0x driven).
constexpr microseconds kTransferGrace{1000};
constexpr microseconds kTransferPerMiB{500};
// How often the progress thread looks at answered sends awaiting delivery.
constexpr std::chrono::milliseconds kLingerPoll{10};
constexpr std::size_t kMaxFailures = 256;

std::string MpiError(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, len);
}

std::string ShapeText(DType dtype, const int64_t* dims, int ndim) {
  std::string s = DTypeName(dtype);
  s += "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

std::string TagText(int tag) { return tag == kAnyTag ? "any tag" : "tag " + std::to_string(tag); }
}  // namespace

P2PChannels::P2PChannels(MPI_Comm comm) {
  CheckMpi(MPI_Comm_dup(comm, &header_), "MPI_Comm_dup");
  CheckMpi(MPI_Comm_dup(comm, &data_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(header_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(header_, MPI_TAG_UB, &ub, &flag);
  if (flag && ub) tag_ub_ = *ub;
}

P2PChannels::~P2PChannels() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (header_ != MPI_COMM_NULL) MPI_Comm_free(&header_);
  if (data_ != MPI_COMM_NULL) MPI_Comm_free(&data_);
}

std::string P2POp::Describe() const {
  std::string s;
  if (dest >= 0 && has_recv)
    s = "sendrecv '" + name + "' (rank " + std::to_string(rank) + " sending to rank " +
        std::to_string(dest) + " with tag " + std::to_string(send_tag) + ", receiving from " +
        (source == kAnySource ? std::string("any rank") : "rank " + std::to_string(source)) +
        " with " + TagText(recv_tag) + ")";
  else if (dest >= 0)
    s = "send '" + name + "' from rank " + std::to_string(rank) + " to rank " + std::to_string(dest) +
        " (tag " + std::to_string(send_tag) + ")";
  else
    s = "recv '" + name + "' on rank " + std::to_string(rank) + " from " +
        (source == kAnySource ? std::string("any rank") : "rank " + std::to_string(source)) + " (" +
        TagText(recv_tag) + ")";
  if (set && set->id() != 0) s += " in process set " + std::to_string(set->id());
  return s;
}

PointToPoint::PointToPoint(const Config& config, CompletionQueue& completions)
    : config_(config), completions_(completions), thread_([this] {
        NameThisThread("jaxcache-p2p");
        ExitAbortsOnThisThread();
        Loop();
      }) {}

PointToPoint::~PointToPoint() {
  Stop(Status::Error(ErrorKind::kShutdown, "jaxcache: the runtime has been shut down"));
}

void PointToPoint::Fail(P2POp& op, ErrorKind kind, std::string message) {
  if (op.outcome.ok()) op.outcome = Status::Error(kind, std::move(message));
}

bool PointToPoint::Post(P2POp& op) {
  Stats& stats = op.set->stats();
  const P2PChannels& ch = op.set->p2p();
  int rc = MPI_SUCCESS;
  if (op.has_recv) {
    op.recv_msg.reset(new char[sizeof(P2PHeader) + kP2PInlineBytes]);
    rc = MPI_Irecv(op.recv_msg.get(), static_cast<int>(sizeof(P2PHeader) + kP2PInlineBytes), MPI_BYTE, op.source,
                   op.recv_tag, ch.header(), &op.reqs[P2POp::kRecvHeader]);
    if (rc != MPI_SUCCESS) {
      Fail(op, ErrorKind::kInternal, "jaxcache: MPI_Irecv failed for " + op.Describe() + ": " + MpiError(rc));
      return false;
    }
  }
  if (op.dest >= 0) {
    rc = MPI_Issend(op.send_msg.get(), static_cast<int>(op.send_msg_bytes), MPI_BYTE, op.dest,
                    op.send_tag, ch.header(), &op.reqs[P2POp::kSendHeader]);
    stats.p2p_messages++;
    if (rc == MPI_SUCCESS && !op.buffered()) {
      rc = MPI_Isend_c(op.send_data, static_cast<MPI_Count>(op.send_bytes), MPI_BYTE, op.dest,
                       op.send_tag, ch.data(), &op.reqs[P2POp::kSendData]);
      stats.p2p_messages++;
    }
    if (rc != MPI_SUCCESS) {
      Fail(op, ErrorKind::kInternal, "jaxcache: MPI_Isend failed for " + op.Describe() + ": " + MpiError(rc));
      return false;
    }
  }
  return true;
}

void PointToPoint::OnHeader(P2POp& op, const MPI_Status& st) {
  const P2PChannels& ch = op.set->p2p();
  op.from = st.MPI_SOURCE;
  op.got_tag = st.MPI_TAG;
  MPI_Count got = 0;
  MPI_Get_count_c(&st, MPI_BYTE, &got);
  P2PHeader h;
  if (got < static_cast<MPI_Count>(sizeof(P2PHeader))) {  // (MPI_Test leaves MPI_ERROR unset)
    Fail(op, ErrorKind::kInternal,
         "jaxcache: " + op.Describe() + " received a malformed message from rank " +
             std::to_string(op.from));
    return;
  }
  std::memcpy(&h, op.recv_msg.get(), sizeof(h));
  if (h.magic != P2PHeader::kMagic || h.dtype >= kNumDTypes || h.ndim > kP2PMaxDims) {
    Fail(op, ErrorKind::kInternal,
         "jaxcache: " + op.Describe() + " received a malformed message from rank " +
             std::to_string(op.from));
    return;
  }
  const DType sent = static_cast<DType>(h.dtype);
  const bool same = sent == op.dtype && h.ndim == op.shape.size() &&
                    std::equal(op.shape.begin(), op.shape.end(), h.dims) &&
                    h.payload_bytes == op.recv_bytes;
  const std::string sender_name(h.name, std::min<std::size_t>(h.name_bytes, sizeof(h.name)));
  if (!same) {
    Fail(op, ErrorKind::kMismatch,
         "jaxcache: " + op.Describe() + " expects " + ShapeText(op.dtype, op.shape.data(), op.shape.size()) +
             ", but rank " + std::to_string(op.from) + " sent " + ShapeText(sent, h.dims, h.ndim) +
             " ('" + sender_name + "', tag " + std::to_string(op.got_tag) +
             "): a send and its receive must agree on dtype and shape");
  }
  if (h.payload_inline) {
    if (same && op.recv_bytes > 0)
      std::memcpy(op.recv_data, op.recv_msg.get() + sizeof(P2PHeader), op.recv_bytes);
  } else if (h.payload_bytes > 0) {
    // The payload follows on the data channel, from the same rank with the same
    // tag: it is taken here (into a scratch buffer on a mismatch), so the
    // sender completes and the channel stays in step.
    void* into = op.recv_data;
    if (!same) {
      op.drain.resize(h.payload_bytes);
      into = op.drain.data();
    }
    int rc = MPI_Irecv_c(into, static_cast<MPI_Count>(h.payload_bytes), MPI_BYTE, op.from, op.got_tag,
                         ch.data(), &op.reqs[P2POp::kRecvData]);
    if (rc != MPI_SUCCESS)
      Fail(op, ErrorKind::kInternal, "jaxcache: MPI_Irecv failed for " + op.Describe() + ": " + MpiError(rc));
  }
  op.recv_msg.reset();
}

bool PointToPoint::Progress(P2POp& op) {
  bool pending = false;
  for (int slot = 0; slot < P2POp::kSlots; ++slot) {
    MPI_Request& req = op.reqs[slot];
    if (req == MPI_REQUEST_NULL) continue;
    int flag = 0;
    MPI_Status st;
    int rc = MPI_Test(&req, &flag, &st);
    if (rc != MPI_SUCCESS) {
      Fail(op, ErrorKind::kInternal, "jaxcache: " + op.Describe() + " failed in MPI: " + MpiError(rc));
      if (req != MPI_REQUEST_NULL) pending = true;
      continue;
    }
    if (!flag) {
      pending = true;
      continue;
    }
    if (slot == P2POp::kRecvHeader) {
      OnHeader(op, st);
      if (op.reqs[P2POp::kRecvData] != MPI_REQUEST_NULL) pending = true;
    }
  }
  return !pending;
}

bool PointToPoint::Cancel(P2POp& op) {
  for (auto& req : op.reqs)
    if (req != MPI_REQUEST_NULL) MPI_Cancel(&req);
  const auto deadline = Clock::now() + kCancelGrace;
  for (;;) {
    bool left = false;
    for (auto& req : op.reqs) {
      if (req == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (!flag) left = true;
    }
    if (!left) return true;
    if (Clock::now() > deadline) break;
    std::this_thread::sleep_for(microseconds(200));
  }
  for (auto& req : op.reqs)
    if (req != MPI_REQUEST_NULL) MPI_Request_free(&req);  // MPI keeps what it still needs
  return false;
}

void PointToPoint::Answer(P2POp& op, bool here) {
  if (!op.done.pending()) return;
  if (op.outcome.ok() && op.has_recv && op.user_status) {
    // mpi4py's Status of the caller (mpi4jax's status=): the source and tag
    // received, and the count in bytes (Get_count(datatype) divides).
    op.user_status->MPI_SOURCE = op.from;
    op.user_status->MPI_TAG = op.got_tag;
    op.user_status->MPI_ERROR = MPI_SUCCESS;
    MPI_Status_set_elements_c(op.user_status, MPI_BYTE, static_cast<MPI_Count>(op.recv_bytes));
  }
  if (!op.outcome.ok()) RecordFailure(op.name, op.outcome);
  if (here) op.done.Run(op.outcome);
  else completions_.Push(std::move(op.done), op.outcome);
}

void PointToPoint::RecordFailure(const std::string& name, const Status& status) {
  std::lock_guard<std::mutex> lock(failures_mu_);
  if (failures_.size() >= kMaxFailures) failures_.erase(failures_.begin());
  failures_[name] = status;
}

Status PointToPoint::TakeFailure(const std::string& name) {
  std::lock_guard<std::mutex> lock(failures_mu_);
  auto it = failures_.find(name);
  if (it == failures_.end()) return Status::Ok();
  Status s = std::move(it->second);
  failures_.erase(it);
  return s;
}

bool PointToPoint::Transferring(const P2POp& op) {
  // A data receive is posted (its header arrived), or a large send's data is
  // on its way (MPI moves it only while both ends poll: a sender that hands
  // over stalls its receiver's copy too).
  return op.reqs[P2POp::kRecvData] != MPI_REQUEST_NULL || op.reqs[P2POp::kSendData] != MPI_REQUEST_NULL;
}

bool PointToPoint::Answerable(const P2POp& op) {
  // A buffered send (payload inside the header message) does not hold XLA's
  // buffer: XLA may go on while MPI still delivers it, like an eager MPI_Send.
  return op.reqs[P2POp::kSendData] == MPI_REQUEST_NULL && op.reqs[P2POp::kRecvHeader] == MPI_REQUEST_NULL &&
         op.reqs[P2POp::kRecvData] == MPI_REQUEST_NULL &&
         (op.buffered() || op.reqs[P2POp::kSendHeader] == MPI_REQUEST_NULL);
}

void PointToPoint::Start(std::unique_ptr<P2POp> op) {
  op->started = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      op->outcome = stopped_;
      Answer(*op, true);
      return;
    }
  }
  if (!Post(*op)) {
    Cancel(*op);
    Answer(*op, true);
    return;
  }
  Reap(false);
  // Drive it here for a while: a peer that is ready answers within
  // microseconds, and then no thread hand-off is needed at all.
  const auto deadline = op->started + microseconds(static_cast<int64_t>(config_.inline_spin_us));
  const auto payload = std::max(op->send_bytes, op->has_recv ? op->recv_bytes : 0);
  const auto transfer_deadline =
      deadline + kTransferGrace + kTransferPerMiB * static_cast<int64_t>(payload >> 20);
  for (;;) {
    const bool complete = Progress(*op);
    if (complete || Answerable(*op)) {
      op->set->stats().p2p_completed_inline++;
      Answer(*op, true);
      if (complete) return;
      // Answered; only the confirmation that a buffered send arrived is left.
      std::lock_guard<std::mutex> lock(linger_mu_);
      lingering_.push_back(std::move(op));
      break;
    }
    const auto now = Clock::now();
    if (now > deadline && !(Transferring(*op) && now < transfer_deadline)) {
      // Not done in time: the progress thread takes it.
      std::lock_guard<std::mutex> lock(mu_);
      incoming_.push_back(std::move(op));
      cv_.notify_one();
      return;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_) cv_.notify_one();  // it waits without a timeout: make it watch the lingering
}

void PointToPoint::Reap(bool inspect) {
  std::unique_lock<std::mutex> lock(linger_mu_, std::defer_lock);
  if (inspect) lock.lock();
  else if (!lock.try_lock()) return;  // someone else reaps
  const auto now = Clock::now();
  for (auto& op : lingering_) {
    if (Progress(*op)) {
      op.reset();
      continue;
    }
    if (!inspect) continue;
    Inspect(*op, now);
    if (op->outcome.kind == ErrorKind::kStall) Abandon(std::move(op));
  }
  lingering_.erase(std::remove(lingering_.begin(), lingering_.end(), nullptr), lingering_.end());
}

bool PointToPoint::Lingering() {
  std::lock_guard<std::mutex> lock(linger_mu_);
  return !lingering_.empty();
}

void PointToPoint::Inspect(P2POp& op, Clock::time_point now) {
  const double age = std::chrono::duration<double>(now - op.started).count();
  if (!op.warned && config_.stall_check_s > 0 && age > config_.stall_check_s) {
    op.warned = true;
    op.set->stats().stall_warnings++;
    std::fprintf(stderr, "jaxcache: warning: %s has waited %.0f s for its peer%s\n",
                 op.Describe().c_str(), age,
                 op.dest >= 0 && !op.has_recv ? " to receive it (no matching recv posted there)"
                                              : " (no matching message has arrived or been received)");
    std::fflush(stderr);
  }
  if (config_.stall_shutdown_s > 0 && age > config_.stall_shutdown_s && op.outcome.ok()) {
    Fail(op, ErrorKind::kStall,
         "jaxcache: " + op.Describe() + " stalled: nothing matched it within " +
             std::to_string(static_cast<int>(config_.stall_shutdown_s)) +
             " s (JAXCACHE_STALL_SHUTDOWN_TIME)");
  }
}

void PointToPoint::Abandon(std::unique_ptr<P2POp> op) {
  // Cancels what it waits for; if MPI does not let go in time, it may still
  // write into the op's buffers, which are then leaked on purpose.
  const bool released = Cancel(*op);
  Answer(*op, false);
  if (!released) op.release();
}

void PointToPoint::Loop() {
  std::vector<std::unique_ptr<P2POp>> active;
  microseconds pause = kFirstPause;
  auto last_reap = Clock::now();
  for (;;) {
    const bool lingering = Lingering();
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (active.empty() && incoming_.empty() && !stopping_) {
        idle_ = !lingering;
        if (lingering) cv_.wait_for(lock, kLingerPoll);
        else cv_.wait(lock);
        idle_ = false;
      } else if (incoming_.empty() && !stopping_) {
        cv_.wait_for(lock, pause);
      }
      if (!incoming_.empty()) pause = kFirstPause;
      for (auto& op : incoming_) active.push_back(std::move(op));
      incoming_.clear();
      if (stopping_) break;
    }
    if (lingering && Clock::now() - last_reap >= kLingerPoll) {
      Reap(true);
      last_reap = Clock::now();
    }
    bool moved = false;
    const auto now = Clock::now();
    for (auto& op : active) {
      const bool complete = Progress(*op);
      if (op->done.pending() && Answerable(*op)) {
        Answer(*op, false);
        moved = true;
      }
      if (complete) {
        op.reset();
        moved = true;
        continue;
      }
      Inspect(*op, now);
      if (op->outcome.kind == ErrorKind::kStall) Abandon(std::move(op));
    }
    active.erase(std::remove(active.begin(), active.end(), nullptr), active.end());
    pause = moved ? kFirstPause : std::min(pause * 2, kLongestPause);
  }
  // Stopping: what is left fails (answered sends awaiting delivery are cancelled).
  {
    std::lock_guard<std::mutex> lock(linger_mu_);
    for (auto& op : lingering_) active.push_back(std::move(op));
    lingering_.clear();
  }
  for (auto& op : active) {
    op->outcome = Status::Ok();
    Fail(*op, stopped_.kind, stopped_.message);
    Abandon(std::move(op));
  }
}

void PointToPoint::Stop(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    stopped_ = why;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

}  // namespace jaxcache
