// The embedding hash table: unbounded int64 ids -> float rows of a fixed dim, with
// optimizer slots stored beside each row, per-id frequency and last-seen step,
// admission by frequency, eviction by age or capacity, and an optional cache of hot rows
// (MixCache, ScaleFreeCTR) inside it.
//
// Framework-agnostic core (no TensorFlow types): table_ops.cc binds it to TF kernels.
//
// Layout:
//  - the ids are split over kNumShards sub-tables by a hash of the id (independent of the
//    probe hash), each with its own index and row arena, so one call fills them all at
//    once, one thread per sub-table, with no lock between them;
//  - a sub-table's index is open addressing (linear probing, backward-shift deletion,
//    power-of-two capacity) of 32-byte entries {key, row, freq, last_seen}: all an id's
//    bookkeeping sits in the one cache line its probe lands on. Every int64 is a valid
//    key; emptiness is marked by row == kEmpty, never by a sentinel key;
//  - rows live in a chunked arena (fixed-size blocks, so growth never moves a row and
//    never copies the whole table) with a free list. A row holds dim values then
//    num_slots * dim optimizer slot values. An entry not yet admitted has no row.
// No per-id heap allocation anywhere.
//
// Row handles: LookupOrInsert reports, per id, where its row is (sub-table, row and the
// table's generation); ApplyGradients given them does not probe again. Anything that may
// free or move a row (eviction, import) starts a new generation, and handles of an older
// one are ignored (the id is probed), so a stale handle can never reach a wrong row.
//
// The cache (capacity > 0): a cached id's row and slots live in a dense array found
// through a small index sized to the cache (it stays in the CPU's caches), and while an
// id is cached that copy is authoritative (row, slots, frequency, last-seen step); the
// sub-table's copy is brought up to date by a flush (and when the id leaves the cache),
// which every export and eviction runs first. Admission is LFU on exact frequencies,
// decided at lookup time: after a lookup, an id that missed the cache enters it when its
// accumulated frequency is at least min_count (and it has a row) and either a slot is free
// or it is strictly more frequent than the least frequent cached id, which it replaces
// (ties among victims: least recently seen, then lowest id; among candidates: most
// frequent, then lowest id). A rebalance re-fills the cache with the exactly most frequent
// ids at once. Reads and updates of cached and uncached rows share one code path: an id
// resolves to a row pointer (cache array or arena), and one fold and one optimizer routine
// serve both, so cache on and cache off give bit-equal rows.
//
// Concurrency: a reader-writer lock. Pure reads (lookup, size, export without a cache)
// take it shared; anything that changes the structure, counters or row values takes it
// exclusive. Within one call the heavy loops run on the caller's thread pool
// (ParallelFor), split by sub-table.
#ifndef GMETA_OPS_HASH_TABLE_H_
#define GMETA_OPS_HASH_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

namespace gmeta {

// Runs fn(begin, end) over [0, n) in parallel chunks; cost is per-item work units.
using ParallelFor = std::function<void(int64_t n, int64_t cost,
                                       const std::function<void(int64_t, int64_t)>& fn)>;

enum class Initializer { kZeros, kUniform, kNormal };

struct TableConfig {
  int64_t dim = 0;
  int64_t num_slots = 0;       // optimizer state vectors per row (sgd 0, adagrad 1, adam 2)
  float slot_init = 0.0f;      // initial value of every slot (e.g. Adagrad's accumulator)
  uint64_t seed = 0;           // initial rows are a function of (seed, id) only
  Initializer initializer = Initializer::kUniform;
  float init_scale = 0.05f;    // uniform: [-scale, scale); normal: stddev
  int64_t admit_after = 1;     // an id gets a trainable row once seen this many times
  float default_value = 0.0f;  // what ids without a row read
  int64_t cache_capacity = 0;  // hot rows cached (0: no cache)
  int64_t cache_min_count = 2; // occurrences an id needs before it may enter the cache
};

// Optimizer hyper-parameters for ApplyGradients.
enum class Optimizer { kSgd, kAdagrad, kAdam };
struct OptimizerParams {
  Optimizer kind = Optimizer::kSgd;
  float learning_rate = 0.01f;
  float epsilon = 1e-7f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  int64_t step = 1;  // Adam's bias-correction step (1-based)
};

struct ExportedTable {
  std::vector<int64_t> ids;        // sorted ascending
  std::vector<float> values;       // ids.size() * dim (default_value for rows not admitted)
  std::vector<float> slots;        // ids.size() * num_slots * dim
  std::vector<int64_t> freq;
  std::vector<int64_t> last_seen;
  std::vector<uint8_t> admitted;
};

struct CacheStats {
  int64_t capacity = 0;
  int64_t size = 0;
  int64_t lookups = 0;         // id occurrences looked up (ids weighted by their counts)
  int64_t hits = 0;            // occurrences served from the cache
  int64_t unique_lookups = 0;  // distinct ids per call, summed over calls
  int64_t unique_hits = 0;     // of those, ids already cached when looked up
  int64_t admitted = 0;
  int64_t evicted = 0;         // entries dropped from the cache (written back when dirty)
  int64_t written_back = 0;    // entries written back (eviction and flush)
};

// The splitmix64 finalizer: a bijective mix of all 64 bits.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Owner rank of an id. Uses a hash independent of the table's probe hash, so a rank's
// ids still spread over its whole index.
inline int64_t OwnerOf(int64_t id, int64_t num_partitions) {
  return static_cast<int64_t>(Mix64(static_cast<uint64_t>(id) ^ 0x5851F42D4C957F2DULL) %
                              static_cast<uint64_t>(num_partitions));
}

// Deterministic initial row for (seed, id).
void InitialRow(const TableConfig& config, int64_t id, float* out);

class HashTable {
 public:
  static constexpr int64_t kNoHandle = -1;  // a row handle meaning "probe for it"

  explicit HashTable(const TableConfig& config);
  ~HashTable();
  HashTable(const HashTable&) = delete;
  HashTable& operator=(const HashTable&) = delete;

  const TableConfig& config() const { return config_; }
  bool HasCache() const { return config_.cache_capacity > 0; }
  int64_t Size() const;          // ids known (admitted or not)
  int64_t AdmittedSize() const;  // ids with a row
  int64_t IndexCapacity() const; // index entries over all sub-tables

  // Looks up ids, inserting missing ones; counts[i] (or 1 when counts is null) is added
  // to each id's frequency and last_seen is set to step. Writes n * dim values, and, when
  // handles is given, n row handles for ApplyGradients (kNoHandle for ids without a row
  // or read from the cache). Ids without a row read default_value.
  void LookupOrInsert(const int64_t* ids, const int64_t* counts, int64_t n, int64_t step,
                      float* values, int64_t* handles, const ParallelFor& pfor);

  // Read-only lookup: unknown or not admitted ids read the default row; found[i] tells
  // which ids have a row (found may be null). No counting, no cache admission.
  void Lookup(const int64_t* ids, int64_t n, float* values, bool* found,
              const ParallelFor& pfor) const;

  // Applies one optimizer step to the rows of ids with gradients grads (n * dim).
  // Duplicated ids have their gradients summed first (in order of appearance); ids
  // unknown or not admitted are skipped. handles (may be null) are LookupOrInsert's for
  // these ids. Returns the number of rows updated.
  int64_t ApplyGradients(const int64_t* ids, const int64_t* handles, const float* grads,
                         int64_t n, const OptimizerParams& params, const ParallelFor& pfor);

  // Removes ids last seen before step - max_age (max_age < 0: no age limit), then, while
  // more than max_size ids remain (max_size < 0: no limit), the least recently seen ones.
  // Returns the evicted ids, sorted.
  std::vector<int64_t> Evict(int64_t step, int64_t max_age, int64_t max_size);

  ExportedTable Export();

  // Inserts or overwrites entries. With clear_first the table is emptied first (the
  // cache too: cached rows never shadow what is imported).
  // Only ids whose OwnerOf(id, num_shards) == shard_index are kept (num_shards <= 1: all).
  // Returns the number of ids imported.
  int64_t Import(const int64_t* ids, const float* values, const float* slots,
                 const int64_t* freq, const int64_t* last_seen, const uint8_t* admitted,
                 int64_t n, bool clear_first, int64_t shard_index, int64_t num_shards);

  // The cache's own operations (require HasCache()).
  // Writes every cached entry changed since its last write-back to its sub-table; returns
  // how many were written. The entries stay cached.
  int64_t FlushCache();
  // Flushes, then makes the cached set the min(capacity, rows) most frequent ids with a
  // row (ties by ascending id). Rows, slots and counters are unchanged. Returns how many
  // ids are cached.
  int64_t RebalanceCache(const ParallelFor& pfor);
  CacheStats GetCacheStats() const;
  std::vector<int64_t> CachedIds() const;  // sorted

  std::string DebugString() const;

  static constexpr int kShardBits = 6;
  static constexpr int64_t kNumShards = int64_t{1} << kShardBits;

 private:
  struct Shard;
  struct Cache;
  struct Target;

  static int64_t ShardOf(int64_t key) {
    return static_cast<int64_t>(Mix64(static_cast<uint64_t>(key) ^ 0x9FB21C651E98DF25ULL) >>
                                (64 - kShardBits));
  }
  int64_t stride() const { return config_.dim * (1 + config_.num_slots); }
  // Positions 0..n-1 of ids, grouped by sub-table (in order within each): order holds
  // them, begin[s]..begin[s + 1] is sub-table s's part, and key[k] = ids[order[k]] (so
  // the loops over a sub-table read its ids in sequence, not scattered over ids);
  // likewise count[k] = counts[order[k]] when counts is given. Its arrays are kept for
  // the next call (they are only used under the exclusive lock).
  struct Grouping {
    std::vector<int32_t> order;
    std::vector<int64_t> begin, key, count, chunk_offset;
  };
  void GroupByShard(const int64_t* ids, const int64_t* counts, int64_t n,
                    const ParallelFor& pfor);
  void InitRow(float* row, int64_t key) const;
  void LookupOrInsertInTable(const int64_t* ids, const int64_t* counts, int64_t n,
                             int64_t step, float* values, int64_t* handles, int64_t* freq_out,
                             const ParallelFor& pfor);
  // An id's entry: row pointer (null without a row), counters; false when unknown.
  bool ReadEntry(int64_t key, const float** row, int64_t* freq, int64_t* last_seen) const;
  // Writes entries into their sub-tables, giving each a row (the cache's write-back).
  void WriteEntries(const int64_t* ids, const float* rows, const int64_t* freq,
                    const int64_t* last_seen, int64_t n);
  std::vector<int64_t> MostFrequentLocked(int64_t k) const;
  void ClearLocked();

  // The cache (table_cache.cc); all under the exclusive lock.
  void CacheLookup(const int64_t* ids, const int64_t* counts, int64_t n, int64_t step,
                   float* values, int64_t* handles, const ParallelFor& pfor);
  void CacheAdmit(const int64_t* ids, const int64_t* counts, const int64_t* freq, int64_t n,
                  const ParallelFor& pfor);
  void CacheWriteBack(const std::vector<int32_t>& slots);
  void CacheFlushLocked();
  std::vector<int32_t> CacheReadIn(const std::vector<int64_t>& ids, const ParallelFor& pfor);
  void CacheDrop(const std::vector<int64_t>& ids);
  void CacheClear();

  const TableConfig config_;
  mutable std::shared_mutex mu_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unique_ptr<Cache> cache_;  // null without a cache
  uint64_t generation_ = 0;       // bumped whenever rows may be freed or moved
  uint64_t apply_epoch_ = 0;      // ApplyGradients' duplicate marks
  Grouping grouping_;             // GroupByShard's answer, under the exclusive lock
};

// Virtual Sparse Id: raw ids -> unique ids (in first-seen order, grouped by owner when
// num_partitions > 1), the index of each raw id into the unique list, each unique id's
// count, and the number of unique ids per owner. Dedup asks `allocate` once, with the
// number of unique ids u, for where to write them: unique_ids and counts (u each), inverse
// (one per raw id) and splits (num_partitions). Null splits there end the call (the
// caller keeps the reason); the others may be null where their size is 0.
struct DedupOutputs {
  int64_t* unique_ids = nullptr;
  int32_t* inverse = nullptr;
  int64_t* counts = nullptr;
  int32_t* splits = nullptr;
};
using DedupAllocate = std::function<DedupOutputs(int64_t num_unique)>;
void Dedup(const int64_t* ids, int64_t n, int64_t num_partitions,
           const DedupAllocate& allocate, const ParallelFor& pfor);

}  // namespace gmeta

#endif  // GMETA_OPS_HASH_TABLE_H_
