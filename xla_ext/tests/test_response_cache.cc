// ResponseCache: bit assignment, LRU eviction and bit reuse, and the
// determinism every rank relies on to agree on the layout without talking.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "check.h"
#include "response_cache.h"

using namespace jaxcache;

namespace {

Signature FloatSig(int64_t n) {
  Signature s;
  s.tensors.push_back({DType::kFloat32, {n}});
  return s;
}

// Inserts `name` with a one-tensor signature; returns its bit.
uint32_t Put(ResponseCache& cache, const std::string& name, std::optional<std::string>* evicted = nullptr,
             int64_t n = 4) {
  std::optional<std::string> ignored;
  return cache.Insert(name, FloatSig(n), nullptr, evicted ? evicted : &ignored);
}

// A cache of `capacity` filled with a0, a1, ... in order (bits 0, 1, ...).
ResponseCache Filled(std::size_t capacity) {
  ResponseCache cache(capacity);
  for (std::size_t i = 0; i < capacity; ++i) Put(cache, "a" + std::to_string(i));
  return cache;
}

// Tiny deterministic generator, so both caches of a determinism test see the same stream.
struct Lcg {
  uint64_t state;
  uint32_t Next(uint32_t bound) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33) % bound;
  }
};

}  // namespace

TEST(ResponseCache, InsertAssignsLowestFreeBits) {
  ResponseCache cache(4);
  CHECK_EQ(Put(cache, "x"), 0u);
  CHECK_EQ(Put(cache, "y"), 1u);
  CHECK_EQ(Put(cache, "z"), 2u);
  CHECK_EQ(cache.size(), 3u);
  CHECK(cache.Occupied(2));
  CHECK(!cache.Occupied(3));
  CHECK(!cache.Occupied(99));  // out of range is simply not occupied
  CHECK_EQ(cache.NameAt(1), std::string("y"));
}

TEST(ResponseCache, FindReportsHitMissAndInvalid) {
  ResponseCache cache(4);
  Put(cache, "x");
  const uint32_t y = Put(cache, "y", nullptr, 8);
  uint32_t bit = 77;
  CHECK(cache.Find("y", FloatSig(8), &bit) == ResponseCache::Lookup::kHit);
  CHECK_EQ(bit, y);
  bit = 77;
  CHECK(cache.Find("nope", FloatSig(8), &bit) == ResponseCache::Lookup::kMiss);
  CHECK_EQ(bit, 77u);  // a miss leaves the bit alone
  CHECK(cache.Find("y", FloatSig(9), &bit) == ResponseCache::Lookup::kInvalid);
  CHECK_EQ(bit, y);  // an invalid entry names its bit (to be erased everywhere)
}

TEST(ResponseCache, FullCacheEvictsLeastRecentlyInsertedAndReusesItsBit) {
  ResponseCache cache = Filled(3);
  std::optional<std::string> evicted;
  const uint32_t bit = Put(cache, "new", &evicted);
  CHECK_EQ(bit, 0u);
  CHECK(evicted.has_value());
  CHECK_EQ(evicted.value_or(""), std::string("a0"));
  CHECK_EQ(cache.size(), 3u);
  uint32_t found;
  CHECK(cache.Find("a0", FloatSig(4), &found) == ResponseCache::Lookup::kMiss);
  CHECK_EQ(cache.NameAt(0), std::string("new"));
  // The next eviction takes the next oldest, a1 at bit 1.
  evicted.reset();
  CHECK_EQ(Put(cache, "newer", &evicted), 1u);
  CHECK_EQ(evicted.value_or(""), std::string("a1"));
}

TEST(ResponseCache, TouchMovesEntryToMostRecentlyUsed) {
  ResponseCache cache = Filled(3);
  cache.Touch(0);  // a0 was used: a1 is now the oldest
  std::optional<std::string> evicted;
  CHECK_EQ(Put(cache, "new", &evicted), 1u);
  CHECK_EQ(evicted.value_or(""), std::string("a1"));
  cache.Touch(2);
  cache.Touch(0);  // order, newest first: a0, a2, new(bit 1)
  evicted.reset();
  CHECK_EQ(Put(cache, "newer", &evicted), 1u);
  CHECK_EQ(evicted.value_or(""), std::string("new"));
}

TEST(ResponseCache, ReinsertRefreshesInPlaceWithoutEviction) {
  ResponseCache cache = Filled(2);
  std::optional<std::string> evicted;
  auto agreement = std::make_shared<Agreement>();
  agreement->rows = {3, 5};
  // a0 renegotiated with another shape: same bit, new signature, now most recent.
  CHECK_EQ(cache.Insert("a0", FloatSig(16), agreement, &evicted), 0u);
  CHECK(!evicted.has_value());
  CHECK_EQ(cache.size(), 2u);
  CHECK(cache.SignatureAt(0) == FloatSig(16));
  CHECK(cache.AgreementAt(0) == agreement);
  CHECK_EQ(Put(cache, "b", &evicted), 1u);  // a1 is the oldest now, not a0
  CHECK_EQ(evicted.value_or(""), std::string("a1"));
}

TEST(ResponseCache, EraseFreesBitForNextInsertWithoutEviction) {
  ResponseCache cache = Filled(3);
  cache.Erase(1);
  CHECK(!cache.Occupied(1));
  CHECK_EQ(cache.size(), 2u);
  std::optional<std::string> evicted;
  CHECK_EQ(Put(cache, "b", &evicted), 1u);
  CHECK(!evicted.has_value());
  cache.Erase(1);
  cache.Erase(1);  // erasing a free bit is a no-op
  cache.Touch(1);  // and so is touching one
  CHECK_EQ(cache.size(), 2u);
  // The erased entry left the LRU list too: the next evictions take a0, then a2.
  Put(cache, "c");
  CHECK_EQ(Put(cache, "d", &evicted), 0u);
  CHECK_EQ(evicted.value_or(""), std::string("a0"));
}

TEST(ResponseCache, ClearForgetsEverything) {
  ResponseCache cache = Filled(3);
  cache.Clear();
  CHECK_EQ(cache.size(), 0u);
  CHECK(cache.Layout().empty());
  for (uint32_t b = 0; b < 3; ++b) CHECK(!cache.Occupied(b));
  std::optional<std::string> evicted;
  CHECK_EQ(Put(cache, "z", &evicted), 0u);
  CHECK(!evicted.has_value());
}

TEST(ResponseCache, LayoutMapsEveryNameToItsBit) {
  ResponseCache cache = Filled(3);
  const auto layout = cache.Layout();
  CHECK_EQ(layout.size(), 3u);
  for (uint32_t b = 0; b < 3; ++b) CHECK_EQ(layout.at("a" + std::to_string(b)), b);
}

// Two ranks applying the same inserts, touches and erases agree on every bit
// and every eviction, at every step.
TEST(ResponseCache, SameOperationsGiveSameLayoutOnTwoCaches) {
  ResponseCache a(8), b(8);
  Lcg rng{42};
  for (int step = 0; step < 2000; ++step) {
    const uint32_t op = rng.Next(10), key = rng.Next(20);
    if (op < 6) {
      std::optional<std::string> ev_a, ev_b;
      const std::string name = "t" + std::to_string(key);
      CHECK_EQ(Put(a, name, &ev_a), Put(b, name, &ev_b));
      CHECK(ev_a == ev_b);
    } else if (op < 9) {
      a.Touch(key % 8);
      b.Touch(key % 8);
    } else {
      a.Erase(key % 8);
      b.Erase(key % 8);
    }
    if (a.Layout() != b.Layout()) {
      CHECK(a.Layout() == b.Layout());
      return;
    }
  }
  CHECK(a.size() >= 7u);  // 20 names keep the cache (nearly) full
}

namespace {

// The documented policy, written as plainly as possible: a free bit is the
// lowest one; a full cache reuses the bit of the least recently used entry.
struct ModelLru {
  std::vector<std::string> slots;  // "" = free
  std::vector<uint32_t> recency;   // front = most recently used
  void Use(uint32_t bit) {
    std::erase(recency, bit);
    recency.insert(recency.begin(), bit);
  }
  uint32_t Insert(const std::string& name) {
    for (uint32_t b = 0; b < slots.size(); ++b)
      if (slots[b] == name) return Use(b), b;
    uint32_t bit = 0;
    while (bit < slots.size() && !slots[bit].empty()) ++bit;
    if (bit == slots.size()) bit = recency.back();
    slots[bit] = name;
    Use(bit);
    return bit;
  }
};

}  // namespace

TEST(ResponseCache, EvictionFollowsReferenceLruModel) {
  ResponseCache cache(5);
  ModelLru model{std::vector<std::string>(5), {}};
  Lcg rng{7};
  for (int step = 0; step < 3000; ++step) {
    const std::string name = "t" + std::to_string(rng.Next(12));
    if (rng.Next(4) == 0) {  // a hit: touch the entry if it is cached
      uint32_t bit;
      if (cache.Find(name, FloatSig(4), &bit) == ResponseCache::Lookup::kHit) {
        cache.Touch(bit);
        model.Use(bit);
      }
      continue;
    }
    const uint32_t got = Put(cache, name), want = model.Insert(name);
    if (got != want) {
      CHECK_EQ(got, want);
      return;
    }
  }
}
