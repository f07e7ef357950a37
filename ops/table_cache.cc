// What is the cache's own in HashTable (see hash_table.h): its index, the lookup through
// it with admission by exact frequency, write-back, flush and rebalance, its counters.
// Reads, updates, export and import of cached rows are HashTable's one code path.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <numeric>
#include <tuple>

#include "hash_table.h"
#include "hash_table_internal.h"

namespace gmeta {

HashTable::Cache::Cache(int64_t capacity_, int64_t min_count_, int64_t row_stride)
    : capacity(capacity_), min_count(min_count_), stride(row_stride) {
  const int64_t index_size = NextPow2(std::max<int64_t>(16, 2 * capacity));
  index.assign(index_size, IndexEntry{0, kFree});
  mask = static_cast<uint64_t>(index_size - 1);
  arena.assign(capacity * stride, 0.0f);
  key.assign(capacity, 0);
  freq.assign(capacity, 0);
  last_seen.assign(capacity, 0);
  dirty.assign(capacity, 0);
  apply_mark.assign(capacity, 0);
  free_slots.resize(capacity);
  // Slot 0 is handed out first: the arena fills from its start.
  std::iota(free_slots.rbegin(), free_slots.rend(), 0);
  stats.capacity = capacity;
}

int32_t HashTable::Cache::Insert(int64_t k) {
  const int32_t slot = free_slots.back();
  free_slots.pop_back();
  uint64_t i = Home(k);
  while (index[i].slot != kFree) i = (i + 1) & mask;
  index[i] = IndexEntry{k, slot};
  key[slot] = k;
  return slot;
}

void HashTable::Cache::Erase(int64_t k) {
  uint64_t i = Home(k);
  while (index[i].slot != kFree && index[i].key != k) i = (i + 1) & mask;
  if (index[i].slot == kFree) return;
  free_slots.push_back(index[i].slot);
  dirty[index[i].slot] = 0;
  BackwardShiftErase(
      index, i, [](const IndexEntry& e) { return e.slot == kFree; },
      [this](const IndexEntry& e) { return Home(e.key); }, [](IndexEntry& e) { e.slot = kFree; });
}

void HashTable::CacheWriteBack(const std::vector<int32_t>& slots) {
  Cache& c = *cache_;
  const int64_t n = static_cast<int64_t>(slots.size());
  if (n == 0) return;
  std::vector<int64_t> ids(n), freq(n), last_seen(n);
  std::vector<float> rows(n * c.stride);
  for (int64_t k = 0; k < n; ++k) {
    const int32_t s = slots[k];
    ids[k] = c.key[s];
    freq[k] = c.freq[s];
    last_seen[k] = c.last_seen[s];
    std::memcpy(rows.data() + k * c.stride, c.Row(s), c.stride * sizeof(float));
    c.dirty[s] = 0;
  }
  WriteEntries(ids.data(), rows.data(), freq.data(), last_seen.data(), n);
  c.stats.written_back += n;
}

std::vector<int32_t> HashTable::CacheReadIn(const std::vector<int64_t>& ids,
                                            const ParallelFor& pfor) {
  Cache& c = *cache_;
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int32_t> slot_of(n, Cache::kFree);
  std::vector<const float*> source(n, nullptr);
  for (int64_t i = 0; i < n; ++i) {
    int64_t freq, last_seen;
    const float* row = nullptr;
    if (!ReadEntry(ids[i], &row, &freq, &last_seen) || !row) continue;  // no row to cache
    const int32_t s = c.Insert(ids[i]);
    slot_of[i] = s;
    source[i] = row;
    c.freq[s] = freq;
    c.last_seen[s] = last_seen;
    c.dirty[s] = 0;
  }
  pfor(n, 2 * c.stride, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (source[i]) std::memcpy(c.Row(slot_of[i]), source[i], c.stride * sizeof(float));
    }
  });
  return slot_of;
}

void HashTable::CacheAdmit(const int64_t* ids, const int64_t* counts, const int64_t* freq,
                           int64_t n, const ParallelFor& pfor) {
  Cache& c = *cache_;
  // Only ids with a row can be cached: after a lookup, those whose frequency reached
  // admit_after. When the cache is full a candidate must beat its coldest entry.
  int64_t bar = std::max<int64_t>({c.min_count, config_.admit_after, 1});
  if (c.free_slots.empty()) {
    bar = std::max(bar, *std::min_element(c.freq.begin(), c.freq.end()) + 1);
  }
  struct Candidate {
    int64_t id, freq;
  };
  std::vector<Candidate> merged;
  for (int64_t k = 0; k < n; ++k) {
    if (freq[k] >= bar) merged.push_back({ids[k], freq[k]});
  }
  if (merged.empty()) return;
  // An id asked for by several requesters appears once per request; the last of them to
  // be counted carries its total frequency (the largest).
  std::sort(merged.begin(), merged.end(), [](const Candidate& a, const Candidate& b) {
    return a.id != b.id ? a.id < b.id : a.freq > b.freq;
  });
  merged.erase(std::unique(merged.begin(), merged.end(),
                           [](const Candidate& a, const Candidate& b) { return a.id == b.id; }),
               merged.end());
  // The hottest first, ties by id so every run agrees; no more than capacity can enter.
  const auto hotter = [](const Candidate& a, const Candidate& b) {
    return a.freq != b.freq ? a.freq > b.freq : a.id < b.id;
  };
  if (static_cast<int64_t>(merged.size()) > c.capacity) {
    std::nth_element(merged.begin(), merged.begin() + c.capacity, merged.end(), hotter);
    merged.resize(c.capacity);
  }
  std::sort(merged.begin(), merged.end(), hotter);

  // Free slots first, then replace the coldest cached entries (LFU; ties: least recently
  // seen, then lowest id) while the candidate is strictly more frequent.
  const int64_t num_candidates = static_cast<int64_t>(merged.size());
  int64_t admit = std::min<int64_t>(c.free_slots.size(), num_candidates);
  int64_t replaced = 0;
  std::vector<std::tuple<int64_t, int64_t, int64_t>> victims;  // (freq, last_seen, key)
  if (admit < num_candidates) {
    const int64_t hottest_left = merged[admit].freq;  // no victim at or above it can go
    for (const Cache::IndexEntry& e : c.index) {
      if (e.slot != Cache::kFree && c.freq[e.slot] < hottest_left) {
        victims.emplace_back(c.freq[e.slot], c.last_seen[e.slot], e.key);
      }
    }
    const int64_t need = std::min<int64_t>(num_candidates - admit, victims.size());
    std::nth_element(victims.begin(), victims.begin() + need, victims.end());
    std::sort(victims.begin(), victims.begin() + need);
    while (replaced < need && merged[admit].freq > std::get<0>(victims[replaced])) {
      ++admit;
      ++replaced;
    }
  }
  if (admit == 0) return;
  if (replaced > 0) {
    std::vector<int32_t> dirty_victims;
    for (int64_t k = 0; k < replaced; ++k) {
      const int32_t s = c.Find(std::get<2>(victims[k]));
      if (c.dirty[s]) dirty_victims.push_back(s);
    }
    CacheWriteBack(dirty_victims);
    for (int64_t k = 0; k < replaced; ++k) c.Erase(std::get<2>(victims[k]));
    c.stats.evicted += replaced;
  }
  std::vector<int64_t> admit_ids(admit);
  for (int64_t k = 0; k < admit; ++k) admit_ids[k] = merged[k].id;
  // The lookup just brought the sub-tables' entries up to date: the cached copies start
  // identical (clean).
  const std::vector<int32_t> slot_of = CacheReadIn(admit_ids, pfor);
  // Each admitted id's first occurrence in this call missed; its others read the cache.
  // Its occurrences are summed over every request that asked for it, through a set of
  // the admitted ids small enough to stay in the CPU's caches.
  const uint64_t set_mask = static_cast<uint64_t>(NextPow2(std::max<int64_t>(16, 4 * admit))) - 1;
  std::vector<int64_t> set_key(set_mask + 1);
  std::vector<uint8_t> set_used(set_mask + 1, 0);
  const auto set_home = [set_mask](int64_t key) {
    return Mix64(static_cast<uint64_t>(key) ^ 0x2545F4914F6CDD1DULL) & set_mask;
  };
  int64_t entered = 0;
  for (int64_t k = 0; k < admit; ++k) {
    if (slot_of[k] == Cache::kFree) continue;
    ++entered;
    uint64_t i = set_home(admit_ids[k]);
    while (set_used[i]) i = (i + 1) & set_mask;
    set_used[i] = 1;
    set_key[i] = admit_ids[k];
  }
  c.stats.admitted += entered;
  std::atomic<int64_t> occurrences{0};
  pfor(n, 10, [&](int64_t begin, int64_t end) {
    int64_t local = 0;
    for (int64_t k = begin; k < end; ++k) {
      for (uint64_t i = set_home(ids[k]); set_used[i]; i = (i + 1) & set_mask) {
        if (set_key[i] == ids[k]) {
          local += counts ? counts[k] : 1;
          break;
        }
      }
    }
    occurrences += local;
  });
  c.stats.hits += occurrences.load() - entered;
}

void HashTable::CacheLookup(const int64_t* ids, const int64_t* counts, int64_t n, int64_t step,
                            float* values, int64_t* handles, const ParallelFor& pfor) {
  Cache& c = *cache_;
  const int64_t dim = config_.dim;
  std::vector<int32_t> slot_of(n);
  pfor(n, 20, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchDistance < end) __builtin_prefetch(&c.index[c.Home(ids[i + kPrefetchDistance])]);
      slot_of[i] = c.Find(ids[i]);
    }
  });
  std::vector<int64_t> miss;
  for (int64_t i = 0; i < n; ++i) {  // bookkeeping only: serial, touches hits alone
    const int64_t count = counts ? counts[i] : 1;
    c.stats.lookups += count;
    const int32_t s = slot_of[i];
    if (s == Cache::kFree) {
      miss.push_back(i);
      continue;
    }
    c.freq[s] += count;
    c.last_seen[s] = step;
    c.dirty[s] = 1;
    c.stats.hits += count;
    ++c.stats.unique_hits;
  }
  c.stats.unique_lookups += n;
  pfor(n, 2 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (slot_of[i] == Cache::kFree) continue;
      std::memcpy(values + i * dim, c.Row(slot_of[i]), dim * sizeof(float));
      if (handles) handles[i] = kNoHandle;  // ApplyGradients finds cached ids in the cache
    }
  });
  if (miss.empty()) return;

  const int64_t m = static_cast<int64_t>(miss.size());
  std::vector<int64_t> miss_ids(m), miss_counts(counts ? m : 0), miss_freq(m), miss_handles(m);
  for (int64_t k = 0; k < m; ++k) {
    miss_ids[k] = ids[miss[k]];
    if (counts) miss_counts[k] = counts[miss[k]];
  }
  std::vector<float> miss_values(m * dim);
  LookupOrInsertInTable(miss_ids.data(), counts ? miss_counts.data() : nullptr, m, step,
                        miss_values.data(), miss_handles.data(), miss_freq.data(), pfor);
  pfor(m, 2 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      std::memcpy(values + miss[k] * dim, miss_values.data() + k * dim, dim * sizeof(float));
      if (handles) handles[miss[k]] = miss_handles[k];
    }
  });
  CacheAdmit(miss_ids.data(), counts ? miss_counts.data() : nullptr, miss_freq.data(), m, pfor);
}

void HashTable::CacheFlushLocked() {
  std::vector<int32_t> dirty;
  for (const Cache::IndexEntry& e : cache_->index) {
    if (e.slot != Cache::kFree && cache_->dirty[e.slot]) dirty.push_back(e.slot);
  }
  CacheWriteBack(dirty);
}

int64_t HashTable::FlushCache() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  const int64_t before = cache_->stats.written_back;
  CacheFlushLocked();
  return cache_->stats.written_back - before;
}

void HashTable::CacheDrop(const std::vector<int64_t>& ids) {
  for (int64_t id : ids) cache_->Erase(id);
}

void HashTable::CacheClear() {
  Cache& c = *cache_;
  std::fill(c.index.begin(), c.index.end(), Cache::IndexEntry{0, Cache::kFree});
  std::fill(c.dirty.begin(), c.dirty.end(), 0);
  c.free_slots.resize(c.capacity);
  std::iota(c.free_slots.rbegin(), c.free_slots.rend(), 0);
}

int64_t HashTable::RebalanceCache(const ParallelFor& pfor) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  Cache& c = *cache_;
  CacheFlushLocked();  // the sub-tables' frequencies are now the exact ones
  const std::vector<int64_t> top = MostFrequentLocked(c.capacity);
  std::vector<uint8_t> keep(c.capacity, 0);
  std::vector<int64_t> read_in;
  for (int64_t id : top) {
    const int32_t s = c.Find(id);
    if (s == Cache::kFree) {
      read_in.push_back(id);
    } else {
      keep[s] = 1;
    }
  }
  std::vector<int64_t> dropped;
  for (const Cache::IndexEntry& e : c.index) {
    if (e.slot != Cache::kFree && !keep[e.slot]) dropped.push_back(e.key);
  }
  CacheDrop(dropped);  // clean after the flush: nothing to write
  c.stats.evicted += static_cast<int64_t>(dropped.size());
  const std::vector<int32_t> slot_of = CacheReadIn(read_in, pfor);
  c.stats.admitted += std::count_if(slot_of.begin(), slot_of.end(),
                                    [](int32_t s) { return s != Cache::kFree; });
  return c.Size();
}

CacheStats HashTable::GetCacheStats() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  CacheStats s = cache_->stats;
  s.size = cache_->Size();
  return s;
}

std::vector<int64_t> HashTable::CachedIds() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<int64_t> ids;
  for (const Cache::IndexEntry& e : cache_->index) {
    if (e.slot != Cache::kFree) ids.push_back(e.key);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace gmeta
