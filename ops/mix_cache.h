// MixCache (ScaleFreeCTR): a cache of hot embedding rows in front of a host HashTable.
//
// A cached id's row and optimizer slots live in a dense array indexed by a small
// open-addressing map {key, slot} sized to the cache (it stays in the CPU's caches),
// so lookups and updates of hot ids never probe the host table's large index. While an
// id is cached the cache holds its authoritative state (row, slots, frequency, last-seen
// step); the host table's copy is brought up to date by Flush (and by eviction), which
// every export and checkpoint runs first.
//
// Admission (LFU on exact frequencies, decided at lookup time; no periodic re-fill is
// needed): the host table counts every id's occurrences, and the cache counts its own
// ids', so the frequency of every id looked up is known exactly. After a lookup, an id
// that missed the cache enters it when its accumulated frequency is at least min_count
// (and it has a row) and either a slot is free or it is strictly more frequent than the
// least frequent cached id, which it replaces (ties among victims: least recently seen,
// then lowest id; among candidates: most frequent, then lowest id). Its state is read from
// the host table, where the lookup just left it, so the cached copy starts identical.
// Eviction writes the evicted entries back to the host table.
//
// Rebalance re-fills the cache with the host table's exactly most frequent ids (after a
// flush; one pass over the host index and a partial selection, no export): the cache the
// admission rule converges to, for callers that want it at once (e.g. after an import).
//
// On a GPU the dense array would live in device memory; on CPU it is host memory whose
// benefit is locality (hot rows contiguous, one small index), not transfers.
//
// Thread safety: one mutex around every call (the owner side calls it from one thread).
#ifndef GMETA_OPS_MIX_CACHE_H_
#define GMETA_OPS_MIX_CACHE_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "hash_table.h"

namespace gmeta {

struct MixCacheStats {
  int64_t capacity = 0;
  int64_t size = 0;
  int64_t lookups = 0;         // id occurrences looked up (ids weighted by their counts)
  int64_t hits = 0;            // occurrences served from the cache
  int64_t unique_lookups = 0;  // distinct ids per call, summed over calls
  int64_t unique_hits = 0;     // of those, ids already cached when looked up
  int64_t admitted = 0;
  int64_t evicted = 0;         // entries written back to the host table and dropped
  int64_t written_back = 0;    // entries written back (eviction and flush)
};

class MixCache {
 public:
  MixCache(const TableConfig& table_config, int64_t capacity, int64_t min_count);
  MixCache(const MixCache&) = delete;
  MixCache& operator=(const MixCache&) = delete;

  // HashTable::LookupOrInsert through the cache (see the file comment for admission).
  void LookupOrInsert(HashTable& table, const int64_t* ids, const int64_t* counts, int64_t n,
                      int64_t step, float* values, const ParallelFor& pfor);

  // HashTable::Lookup through the cache (read-only: no admission, no counting).
  void Lookup(const HashTable& table, const int64_t* ids, int64_t n, float* values,
              bool* found, const ParallelFor& pfor);

  // HashTable::ApplyGradients through the cache: cached rows are updated here with the
  // same arithmetic (duplicates summed in order first), the others in the host table.
  int64_t ApplyGradients(HashTable& table, const int64_t* ids, const float* grads, int64_t n,
                         const OptimizerParams& params, const ParallelFor& pfor);

  // Writes every entry changed since its last write-back to the host table; returns how
  // many were written. The entries stay cached.
  int64_t Flush(HashTable& table);

  // Forgets ids without writing them back (after the host table evicted them).
  void Drop(const int64_t* ids, int64_t n);

  // Flushes, then makes the cached set the host table's min(capacity, rows) most frequent
  // ids (ties by ascending id): ids already cached stay, the others are dropped (clean
  // after the flush) or read in. Rows, slots and counters are unchanged. Returns how many
  // ids are cached.
  int64_t Rebalance(HashTable& table, const ParallelFor& pfor);

  // Empties the cache without writing back (the host table was replaced by an import).
  void Clear();

  MixCacheStats Stats() const;
  std::vector<int64_t> CachedIds() const;  // sorted

 private:
  static constexpr int32_t kFree = -1;
  struct IndexEntry {
    int64_t key;
    int32_t slot;  // kFree when the index entry is empty
  };

  int64_t stride() const { return dim_ * (1 + num_slots_); }
  float* Row(int32_t slot) { return arena_.data() + static_cast<int64_t>(slot) * stride(); }
  // Salted so the cache's probe sequence is independent of the host table's.
  uint64_t Home(int64_t key) const {
    return Mix64(static_cast<uint64_t>(key) ^ 0xC2B2AE3D27D4EB4FULL) & mask_;
  }
  int32_t Find(int64_t key) const;
  std::vector<int32_t> FindAll(const int64_t* ids, int64_t n, const ParallelFor& pfor) const;
  int32_t Insert(int64_t key);  // a free slot, registered in the index
  void Erase(int64_t key);
  void WriteBack(HashTable& table, const std::vector<int32_t>& slots);
  void FlushLocked(HashTable& table);
  // Caches ids (not cached now) with their current host-table state; ids without a row
  // in the host table are skipped. Returns the slot of each id (kFree when skipped).
  std::vector<int32_t> ReadIn(const HashTable& table, const std::vector<int64_t>& ids,
                              const ParallelFor& pfor);
  // The admission rule (file comment) for the ids of one lookup that missed the cache.
  void Admit(HashTable& table, const int64_t* ids, const int64_t* counts, const int64_t* freq,
             int64_t n, const ParallelFor& pfor);

  const TableConfig table_config_;
  const int64_t dim_;
  const int64_t num_slots_;
  const int64_t capacity_;
  const int64_t min_count_;
  mutable std::mutex mu_;

  std::vector<IndexEntry> index_;
  uint64_t mask_;
  std::vector<float> arena_;          // capacity * stride: row, then slots
  std::vector<int64_t> key_;          // per slot
  std::vector<int64_t> freq_;
  std::vector<int64_t> last_seen_;
  std::vector<uint8_t> dirty_;
  std::vector<int32_t> free_slots_;
  std::vector<uint64_t> apply_mark_;  // per slot: (epoch << 32) | target, as in HashTable
  uint64_t apply_epoch_ = 0;
  MixCacheStats stats_;
};

}  // namespace gmeta

#endif  // GMETA_OPS_MIX_CACHE_H_
