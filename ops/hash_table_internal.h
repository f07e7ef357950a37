// The parts of HashTable that hash_table.cc and table_cache.cc share: a sub-table (index
// plus row arena) and the cache of hot rows. Not part of the op library's interface.
#ifndef GMETA_OPS_HASH_TABLE_INTERNAL_H_
#define GMETA_OPS_HASH_TABLE_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "hash_table.h"

namespace gmeta {

// Memory latency, not arithmetic, bounds hash-table work on large tables: loops prefetch
// the home slot of the id this many positions ahead.
constexpr int64_t kPrefetchDistance = 8;

// v with at least n elements (grown, never shrunk or cleared): arrays kept between calls.
template <typename T>
T* Sized(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

// How many chunks a pass over n positions is cut into for ParallelFor (~16k or more each).
inline int64_t ParallelChunks(int64_t n) {
  return std::min<int64_t>(64, std::max<int64_t>(1, n >> 14));
}

// A stable counting sort of positions 0..n-1 by bucket_of(i) in [0, buckets), chunk by
// chunk in parallel: each chunk counts its positions per bucket, then hands each one to
// place(i, at) with its sorted index `at`, from the chunk's own offsets. begin receives
// each bucket's start (buckets + 1 entries); chunk_offset is scratch the caller keeps.
template <typename BucketOf, typename Place>
void StableBucketSort(int64_t n, int64_t buckets, BucketOf bucket_of, Place place,
                      int64_t* begin, std::vector<int64_t>* chunk_offset,
                      const ParallelFor& pfor) {
  const int64_t chunks = ParallelChunks(n);
  const auto chunk_begin = [n, chunks](int64_t c) { return n * c / chunks; };
  int64_t* offset = Sized(*chunk_offset, chunks * buckets);
  pfor(chunks, (n / chunks + 1) * 10, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      int64_t* h = offset + c * buckets;
      std::fill(h, h + buckets, 0);
      for (int64_t i = chunk_begin(c); i < chunk_begin(c + 1); ++i) ++h[bucket_of(i)];
    }
  });
  int64_t at = 0;
  for (int64_t b = 0; b < buckets; ++b) {
    begin[b] = at;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t size = offset[c * buckets + b];
      offset[c * buckets + b] = at;  // becomes the chunk's write offset in the bucket
      at += size;
    }
  }
  begin[buckets] = at;
  pfor(chunks, (n / chunks + 1) * 10, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      int64_t* next = offset + c * buckets;
      for (int64_t i = chunk_begin(c); i < chunk_begin(c + 1); ++i) {
        place(i, next[bucket_of(i)]++);
      }
    }
  });
}

inline int64_t NextPow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

// Backward-shift deletion from a linear-probing index (power-of-two size): empties entry
// i and pulls later members of its probe run into the hole, so lookups never need
// tombstones. is_empty(entry), home(entry) (its home position) and clear(entry) describe
// the index's entries.
template <typename Entry, typename IsEmpty, typename Home, typename Clear>
void BackwardShiftErase(std::vector<Entry>& index, uint64_t i, IsEmpty is_empty, Home home,
                        Clear clear) {
  const uint64_t mask = index.size() - 1;
  uint64_t j = i;
  while (true) {
    j = (j + 1) & mask;
    if (is_empty(index[j])) break;
    const uint64_t k = home(index[j]);
    const bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
    if (!stays) {
      index[i] = index[j];
      i = j;
    }
  }
  clear(index[i]);
}

struct HashTable::Shard {
  static constexpr int64_t kBlockRows = 1 << 14;
  static constexpr int64_t kEmpty = -2;     // Slot::row of a free index entry
  static constexpr int64_t kNoRow = -1;     // Slot::row of an id not admitted yet
  static constexpr int64_t kNotFound = -1;  // Find's answer for an absent key

  struct Slot {
    int64_t key;
    int64_t row;
    int64_t freq;
    int64_t last_seen;
  };

  explicit Shard(int64_t row_stride);

  float* RowPtr(int64_t row) const {
    return blocks[row / kBlockRows].get() + (row % kBlockRows) * stride;
  }
  uint64_t Home(int64_t key) const {
    return Mix64(static_cast<uint64_t>(key)) & (slots.size() - 1);
  }
  void PrefetchHome(int64_t key) const { __builtin_prefetch(&slots[Home(key)]); }
  // The key's index entry, or kNotFound; *empty (if given) is where the probe stopped.
  int64_t Find(int64_t key, int64_t* empty = nullptr) const {
    const uint64_t mask = slots.size() - 1;
    for (uint64_t i = Home(key);; i = (i + 1) & mask) {
      const Slot& s = slots[i];
      if (s.row == kEmpty) {
        if (empty) *empty = static_cast<int64_t>(i);
        return kNotFound;
      }
      if (s.key == key) return static_cast<int64_t>(i);
    }
  }
  // Requires room (Reserve): never rehashes.
  int64_t FindOrInsert(int64_t key);
  int64_t InsertAt(int64_t index, int64_t key);  // index: an empty entry on key's probe path
  void Erase(int64_t index);
  void Reserve(int64_t entries);  // index capacity for this many entries
  void Rehash(int64_t new_capacity);
  int64_t NewRow();  // a row index, contents undefined
  void FreeRow(int64_t row);
  void Clear();

  const int64_t stride;
  std::vector<Slot> slots;  // the index, holding every id's bookkeeping
  int64_t num_entries = 0;
  std::vector<std::unique_ptr<float[]>> blocks;
  int64_t rows_allocated = 0;  // high-water mark of the arena
  std::vector<int64_t> free_rows;
  int64_t num_rows_in_use = 0;
  // ApplyGradients' duplicate detection: per row, (epoch << 32) | target index.
  std::vector<uint64_t> apply_mark;
};

struct HashTable::Cache {
  static constexpr int32_t kFree = -1;
  struct IndexEntry {
    int64_t key;
    int32_t slot;  // kFree when the index entry is empty
  };

  Cache(int64_t capacity, int64_t min_count, int64_t row_stride);

  float* Row(int32_t slot) { return arena.data() + static_cast<int64_t>(slot) * stride; }
  // Salted so the cache's probe sequence is independent of the sub-tables'.
  uint64_t Home(int64_t key) const {
    return Mix64(static_cast<uint64_t>(key) ^ 0xC2B2AE3D27D4EB4FULL) & mask;
  }
  int32_t Find(int64_t key) const {
    for (uint64_t i = Home(key);; i = (i + 1) & mask) {
      const IndexEntry& e = index[i];
      if (e.slot == kFree) return kFree;
      if (e.key == key) return e.slot;
    }
  }
  int32_t Insert(int64_t key);  // a free slot, registered in the index
  void Erase(int64_t key);
  int64_t Size() const { return capacity - static_cast<int64_t>(free_slots.size()); }

  const int64_t capacity;
  const int64_t min_count;
  const int64_t stride;
  std::vector<IndexEntry> index;
  uint64_t mask;
  std::vector<float> arena;  // capacity * stride: row, then slots
  std::vector<int64_t> key;  // per slot
  std::vector<int64_t> freq;
  std::vector<int64_t> last_seen;
  std::vector<uint8_t> dirty;
  std::vector<int32_t> free_slots;
  std::vector<uint64_t> apply_mark;  // per slot, as Shard::apply_mark per row
  CacheStats stats;
};

}  // namespace gmeta

#endif  // GMETA_OPS_HASH_TABLE_INTERNAL_H_
