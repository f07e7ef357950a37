// The embedding hash table: unbounded int64 ids -> float rows of a fixed dim, with
// optimizer slots stored beside each row, per-id frequency and last-seen step,
// admission by frequency and eviction by age or capacity.
//
// Framework-agnostic core (no TensorFlow types): table_ops.cc binds it to TF kernels.
//
// Layout:
//  - an open-addressing index (linear probing, backward-shift deletion, power-of-two
//    capacity) of 32-byte entries {key, row, freq, last_seen}: all an id's bookkeeping
//    sits in the one cache line its probe lands on. Every int64 is a valid key;
//    emptiness is marked by row == kEmpty, never by a sentinel key;
//  - rows in a chunked arena (fixed-size blocks, so growth never moves a row and never
//    copies the whole table) with a free list. A row holds dim values then
//    num_slots * dim optimizer slot values. An entry not yet admitted has no row.
// No per-id heap allocation anywhere.
//
// Concurrency: a reader-writer lock. Pure reads (lookup, export, size) take it shared;
// anything that changes the structure or row values takes it exclusive. Within one call
// the heavy loops run on the caller's thread pool (ParallelFor).
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
  explicit HashTable(const TableConfig& config);
  HashTable(const HashTable&) = delete;
  HashTable& operator=(const HashTable&) = delete;

  const TableConfig& config() const { return config_; }
  int64_t Size() const;          // ids known (admitted or not)
  int64_t AdmittedSize() const;  // ids with a row
  int64_t IndexCapacity() const;

  // Looks up ids, inserting missing ones; counts[i] (or 1 when counts is null) is added
  // to each id's frequency and last_seen is set to step. Writes n * dim values. When
  // freq_out is given, freq_out[i] is ids[i]'s frequency once its count was added (an id
  // listed more than once: the largest of its entries is its frequency after the call).
  void LookupOrInsert(const int64_t* ids, const int64_t* counts, int64_t n, int64_t step,
                      float* values, const ParallelFor& pfor, int64_t* freq_out = nullptr);

  // Read-only lookup: unknown or not admitted ids read the default row; found[i] tells
  // which ids have a row (found may be null).
  void Lookup(const int64_t* ids, int64_t n, float* values, bool* found,
              const ParallelFor& pfor) const;

  // Applies one optimizer step to the rows of ids with gradients grads (n * dim).
  // Duplicated ids have their gradients summed first; ids unknown or not admitted are
  // skipped. Returns the number of rows updated.
  int64_t ApplyGradients(const int64_t* ids, const float* grads, int64_t n,
                         const OptimizerParams& params, const ParallelFor& pfor);

  // Removes ids last seen before step - max_age (max_age < 0: no age limit), then, while
  // more than max_size ids remain (max_size < 0: no limit), the least recently seen ones.
  // Returns the evicted ids.
  std::vector<int64_t> Evict(int64_t step, int64_t max_age, int64_t max_size);

  // An export of just these ids (in the given order, no counting): for an id with a row,
  // found[i] is true and row, slots (n * num_slots * dim), frequency and last-seen step
  // are the table's; otherwise values read default_value, slots slot_init, and freq and
  // last_seen are the table's counters of a known id, 0 for an unknown one.
  void ReadEntries(const int64_t* ids, int64_t n, float* values, float* slots, int64_t* freq,
                   int64_t* last_seen, bool* found, const ParallelFor& pfor) const;

  // The ids of the k most frequent entries with a row (fewer when the table has fewer),
  // most frequent first, ties by ascending id. One pass over the index plus a partial
  // selection: no export, no copy of rows.
  std::vector<int64_t> MostFrequent(int64_t k) const;

  ExportedTable Export() const;

  // Inserts or overwrites entries. With clear_first the table is emptied first.
  // Only ids whose OwnerOf(id, num_shards) == shard_index are kept (num_shards <= 1: all).
  // Returns the number of ids imported.
  int64_t Import(const int64_t* ids, const float* values, const float* slots,
                 const int64_t* freq, const int64_t* last_seen, const uint8_t* admitted,
                 int64_t n, bool clear_first, int64_t shard_index, int64_t num_shards);

  std::string DebugString() const;

 private:
  static constexpr int64_t kBlockRows = 1 << 14;

  static constexpr int64_t kEmpty = -2;     // Slot::row of a free slot
  static constexpr int64_t kNoRow = -1;     // Slot::row of an id not admitted yet
  static constexpr int64_t kNotFound = -1;  // FindSlot's answer for an absent key

  struct Slot {
    int64_t key;
    int64_t row;
    int64_t freq;
    int64_t last_seen;
  };

  int64_t stride() const { return config_.dim * (1 + config_.num_slots); }
  float* RowPtr(int64_t row) const {
    return blocks_[row / kBlockRows].get() + (row % kBlockRows) * stride();
  }
  uint64_t Home(int64_t key) const {
    return Mix64(static_cast<uint64_t>(key)) & (slots_.size() - 1);
  }

  int64_t FindSlot(int64_t key) const;           // kNotFound when absent
  int64_t FindOrInsertSlot(int64_t key);         // requires exclusive lock
  void PrefetchHome(int64_t key) const { __builtin_prefetch(&slots_[Home(key)]); }
  void EraseSlot(int64_t slot);                  // requires exclusive lock
  void Reserve(int64_t entries);                 // index capacity for this many entries
  void Rehash(int64_t new_capacity);
  int64_t NewRow();                              // a row index, contents undefined
  void FreeRow(int64_t row);
  void InitRow(int64_t row, int64_t key);        // initial values and slots
  void ClearLocked();

  const TableConfig config_;
  mutable std::shared_mutex mu_;

  std::vector<Slot> slots_;  // the index, holding every id's bookkeeping
  int64_t num_entries_ = 0;

  std::vector<std::unique_ptr<float[]>> blocks_;
  int64_t rows_allocated_ = 0;  // high-water mark of the arena
  std::vector<int64_t> free_rows_;
  int64_t num_rows_in_use_ = 0;

  // ApplyGradients' duplicate detection: per row, (epoch << 32) | target index.
  std::vector<uint64_t> apply_mark_;
  uint64_t apply_epoch_ = 0;
};

// Virtual Sparse Id: raw ids -> unique ids (in first-seen order, grouped by owner when
// num_partitions > 1), the index of each raw id into the unique list, each unique id's
// count, and the number of unique ids per owner.
struct DedupResult {
  std::vector<int64_t> unique_ids;
  std::vector<int32_t> inverse;
  std::vector<int64_t> counts;
  std::vector<int64_t> splits;
};
void Dedup(const int64_t* ids, int64_t n, int64_t num_partitions, DedupResult* out);

}  // namespace gmeta

#endif  // GMETA_OPS_HASH_TABLE_H_
