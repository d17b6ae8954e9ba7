#include "message_table.h"

#include <functional>
#include <numeric>
#include <sstream>

namespace jaxcache {

namespace {

// "rank 0: float32; ranks 1, 2: float64" -- ranks grouped by value; ranks
// without a value (joined) are left out.
std::string DescribeByRank(const std::vector<std::optional<std::string>>& values) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(values.size()); ++r) {
    if (!values[r]) continue;
    auto it = groups.begin();
    for (; it != groups.end(); ++it)
      if (it->first == *values[r]) break;
    if (it == groups.end()) groups.push_back({*values[r], {r}});
    else it->second.push_back(r);
  }
  std::ostringstream out;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g) out << "; ";
    const auto& ranks = groups[g].second;
    out << (ranks.size() == 1 ? "rank " : "ranks ");
    for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
    out << ": " << groups[g].first;
  }
  return out.str();
}

std::string FormatDouble(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

std::string Join(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The checks of one decision, over the ranks that submitted.
class Checker {
 public:
  Checker(const std::string& name, const std::vector<const Signature*>& by_rank)
      : name_(name), by_rank_(by_rank) {
    for (const Signature* s : by_rank)
      if (s) { first_ = s; break; }
  }
  const Signature& first() const { return *first_; }
  int size() const { return static_cast<int>(by_rank_.size()); }

  using Field = std::function<std::string(const Signature&)>;
  // A MismatchError when `key` differs between the submitting ranks; the
  // message shows `shown` (default: the key) of every rank.
  // Only the ranks for which `among` holds (default: every submitting rank) count.
  Status Same(const std::string& field, const Field& key, const Field& shown = nullptr,
              const std::function<bool(const Signature&)>& among = nullptr) const {
    std::vector<std::optional<std::string>> values(by_rank_.size());
    std::optional<std::string> seen;
    bool differs = false;
    for (std::size_t r = 0; r < by_rank_.size(); ++r) {
      if (!by_rank_[r] || (among && !among(*by_rank_[r]))) continue;
      std::string k = key(*by_rank_[r]);
      if (seen && *seen != k) differs = true;
      if (!seen) seen = k;
      values[r] = shown ? shown(*by_rank_[r]) : k;
    }
    if (!differs) return Status::Ok();
    return Error(ErrorKind::kMismatch, field + " differs across ranks (" + DescribeByRank(values) + ")");
  }
  Status Error(ErrorKind kind, const std::string& what) const {
    return Status::Error(kind, std::string("jaxcache: ") +
                                   (kind == ErrorKind::kMismatch ? "mismatched collective '"
                                                                 : "invalid collective '") +
                                   name_ + "' (" + KindName(first_->kind) + "): " + what);
  }
  template <typename Fn>
  void ForEachRank(Fn&& fn) const {
    for (int r = 0; r < size(); ++r)
      if (by_rank_[r]) fn(r, *by_rank_[r]);
  }

 private:
  const std::string& name_;
  const std::vector<const Signature*>& by_rank_;
  const Signature* first_ = nullptr;
};

#define JAXCACHE_RETURN_IF_ERROR(expr) \
  do {                                 \
    Status st_ = (expr);               \
    if (!st_.ok()) return st_;         \
  } while (0)

std::string Which(const Signature& s, std::size_t t) {
  return s.tensors.size() == 1 ? "" : " of tensor " + std::to_string(t);
}

// The shape with its first dimension left open: "(*, 3)" (a scalar: "()").
std::string TrailingShape(const TensorSpec& t) {
  std::string s = "(*";
  for (std::size_t i = 1; i < t.shape.size(); ++i) s += ", " + std::to_string(t.shape[i]);
  return s + ")";
}

Status CheckTensors(const Checker& c, bool first_dim_may_differ) {
  const Signature& first = c.first();
  for (std::size_t t = 0; t < first.tensors.size(); ++t) {
    JAXCACHE_RETURN_IF_ERROR(c.Same("dtype" + Which(first, t), [t](const Signature& s) {
      return std::string(DTypeName(s.tensors[t].dtype));
    }));
    JAXCACHE_RETURN_IF_ERROR(c.Same(
        (first_dim_may_differ ? "shape beyond the first dimension" : "shape") + Which(first, t),
        [&](const Signature& s) {
          const TensorSpec& spec = s.tensors[t];
          return first_dim_may_differ && !spec.shape.empty() ? TrailingShape(spec) : spec.ShapeString();
        },
        [t](const Signature& s) { return s.tensors[t].ShapeString(); }));
  }
  return Status::Ok();
}

Status CheckScalars(const Checker& c) {
  for (std::size_t t = 0; t < c.first().tensors.size(); ++t)
    if (c.first().tensors[t].shape.empty())
      return c.Error(ErrorKind::kInvalidArgument,
                     "tensor " + std::to_string(t) + " is a scalar; it needs a first dimension to split");
  return Status::Ok();
}

// allgather: every rank's rows of every tensor.
Status DecideAllgather(const Checker& c, Agreement* agreement) {
  bool any_static = false;
  c.ForEachRank([&](int, const Signature& s) { any_static |= s.static_shapes; });
  // Outputs sized for equal shapes (jit) need equal shapes; else only the
  // first dimension may differ.
  JAXCACHE_RETURN_IF_ERROR(CheckTensors(c, !any_static));
  const std::size_t n = c.first().tensors.size();
  agreement->static_shapes = any_static;
  agreement->rows.assign(n * c.size(), 0);
  c.ForEachRank([&](int r, const Signature& s) {
    for (std::size_t t = 0; t < n; ++t) agreement->rows[t * c.size() + r] = s.tensors[t].Rows();
  });
  return Status::Ok();
}

// alltoall: the rows every rank sends to every rank.
Status DecideAlltoall(const Checker& c, Agreement* agreement) {
  if (c.first().tensors.size() != 1)
    return c.Error(ErrorKind::kInvalidArgument, "alltoall takes exactly one tensor");
  JAXCACHE_RETURN_IF_ERROR(CheckScalars(c));
  JAXCACHE_RETURN_IF_ERROR(CheckTensors(c, true));
  const int size = c.size();
  // Ranks without splits send equal blocks; those with splits must agree on their number.
  JAXCACHE_RETURN_IF_ERROR(c.Same(
      "number of splits", [](const Signature& s) { return std::to_string(s.splits.size()); }, nullptr,
      [](const Signature& s) { return !s.splits.empty(); }));
  Status bad;
  agreement->rows.assign(static_cast<std::size_t>(size) * size, 0);
  c.ForEachRank([&](int r, const Signature& s) {
    if (!bad.ok()) return;
    const int64_t rows = s.tensors[0].shape[0];
    int64_t* out = &agreement->rows[static_cast<std::size_t>(r) * size];
    if (s.splits.empty()) {
      if (rows % size != 0) {
        bad = c.Error(ErrorKind::kInvalidArgument,
                      "rank " + std::to_string(r) + "'s first dimension " + std::to_string(rows) +
                          " does not split into " + std::to_string(size) +
                          " equal blocks; pass splits (eagerly) or make it divisible");
        return;
      }
      std::fill(out, out + size, rows / size);
      return;
    }
    if (static_cast<int>(s.splits.size()) != size) {
      bad = c.Error(ErrorKind::kMismatch,
                    "rank " + std::to_string(r) + " passed " + std::to_string(s.splits.size()) +
                        " splits but there are " + std::to_string(size) + " ranks");
      return;
    }
    int64_t sum = 0;
    for (int d = 0; d < size; ++d) {
      if (s.splits[d] < 0) {
        bad = c.Error(ErrorKind::kInvalidArgument,
                      "rank " + std::to_string(r) + "'s splits " + Join(s.splits) + " contain a negative count");
        return;
      }
      out[d] = s.splits[d];
      sum += s.splits[d];
    }
    if (sum != rows)
      bad = c.Error(ErrorKind::kInvalidArgument,
                    "rank " + std::to_string(r) + "'s splits " + Join(s.splits) + " sum to " +
                        std::to_string(sum) + " but its first dimension is " + std::to_string(rows));
  });
  JAXCACHE_RETURN_IF_ERROR(bad);
  // Outputs sized like the input (jit) must receive exactly that many rows.
  c.ForEachRank([&](int r, const Signature& s) {
    agreement->static_shapes |= s.static_shapes;
    if (!bad.ok() || !s.static_shapes) return;
    int64_t received = 0;
    for (int src = 0; src < size; ++src) received += agreement->rows[static_cast<std::size_t>(src) * size + r];
    if (received != s.tensors[0].shape[0])
      bad = c.Error(ErrorKind::kMismatch,
                    "rank " + std::to_string(r) + " would receive " + std::to_string(received) +
                        " rows but its result (equal blocks, e.g. under jit) has " +
                        std::to_string(s.tensors[0].shape[0]));
  });
  return bad;
}

}  // namespace

Response MessageTable::Decide(const std::string& name, uint64_t seq,
                              const std::vector<const Signature*>& by_rank) {
  Checker c(name, by_rank);
  Response resp{name, seq, Status::Ok(), c.first(), nullptr};
  auto decide = [&]() -> Status {
    JAXCACHE_RETURN_IF_ERROR(c.Same("kind", [](const Signature& s) { return std::string(KindName(s.kind)); }));
    JAXCACHE_RETURN_IF_ERROR(c.Same("device", [](const Signature& s) { return std::string(DeviceName(s.device)); }));
    JAXCACHE_RETURN_IF_ERROR(c.Same("number of tensors", [](const Signature& s) {
      return std::to_string(s.tensors.size());
    }));
    const Signature& first = c.first();
    switch (first.kind) {
      case Kind::kAllreduce:
      case Kind::kReducescatter:
        JAXCACHE_RETURN_IF_ERROR(c.Same("reduce op", [](const Signature& s) { return std::string(ReduceOpName(s.op)); }));
        JAXCACHE_RETURN_IF_ERROR(c.Same("prescale", [](const Signature& s) { return FormatDouble(s.prescale); }));
        JAXCACHE_RETURN_IF_ERROR(c.Same("postscale", [](const Signature& s) { return FormatDouble(s.postscale); }));
        if (first.kind == Kind::kReducescatter) JAXCACHE_RETURN_IF_ERROR(CheckScalars(c));
        return CheckTensors(c, false);
      case Kind::kBroadcast:
        JAXCACHE_RETURN_IF_ERROR(c.Same("root", [](const Signature& s) { return std::to_string(s.root); }));
        if (first.root < 0 || first.root >= c.size())
          return Status::Error(ErrorKind::kInvalidArgument,
                               "jaxcache: broadcast '" + name + "': root " + std::to_string(first.root) +
                                   " is outside [0, " + std::to_string(c.size()) + ")");
        return CheckTensors(c, false);
      case Kind::kAllgather:
      case Kind::kAlltoall: {
        auto agreement = std::make_shared<Agreement>();
        Status st = first.kind == Kind::kAllgather ? DecideAllgather(c, agreement.get())
                                                   : DecideAlltoall(c, agreement.get());
        resp.agreement = std::move(agreement);
        return st;
      }
      case Kind::kBarrier:
      case Kind::kJoin:
        return CheckTensors(c, false);
    }
    return CheckTensors(c, false);
  };
  resp.status = decide();
  if (!resp.status.ok()) resp.agreement = nullptr;
  return resp;
}

bool MessageTable::Complete(const Entry& e) const {
  for (int r = 0; r < size_; ++r)
    if (!e.by_rank[r] && !joined_[r]) return false;
  return true;
}

Response MessageTable::Take(std::map<std::pair<std::string, uint64_t>, Entry>::iterator it) {
  std::vector<const Signature*> by_rank(size_, nullptr);
  for (int r = 0; r < size_; ++r)
    if (it->second.by_rank[r]) by_rank[r] = &*it->second.by_rank[r];
  Response resp = Decide(it->first.first, it->first.second, by_rank);
  entries_.erase(it);
  return resp;
}

std::optional<Response> MessageTable::Add(int rank, const std::string& name, uint64_t seq,
                                          const Signature& sig) {
  auto it = entries_.try_emplace(std::make_pair(name, seq)).first;
  Entry& e = it->second;
  if (e.by_rank.empty()) e.by_rank.resize(size_);
  e.by_rank[rank] = sig;
  if (!Complete(e)) return std::nullopt;
  return Take(it);
}

std::vector<Response> MessageTable::SetJoined(const std::vector<bool>& joined) {
  bool grew = false;
  for (int r = 0; r < size_; ++r) grew |= joined[r] && !joined_[r];
  joined_ = joined;
  std::vector<Response> decided;
  if (!grew) return decided;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (Complete(it->second)) decided.push_back(Take(it));
    it = next;
  }
  return decided;
}

}  // namespace jaxcache
