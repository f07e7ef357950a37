#include "hash_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <sstream>

#include "hash_table_internal.h"

namespace gmeta {
namespace {

constexpr int64_t kInitialCapacity = 64;  // per sub-table
constexpr double kMaxLoad = 0.7;

// Row handles: generation (19 bits) | sub-table | row; always >= 0.
constexpr int kRowBits = 38;
constexpr uint64_t kRowMask = (uint64_t{1} << kRowBits) - 1;
constexpr uint64_t kGenerationMask = (uint64_t{1} << 19) - 1;
constexpr int kGenerationShift = kRowBits + HashTable::kShardBits;

int64_t MakeHandle(uint64_t generation, int64_t shard, int64_t row) {
  return static_cast<int64_t>(((generation & kGenerationMask) << kGenerationShift) |
                              (static_cast<uint64_t>(shard) << kRowBits) |
                              static_cast<uint64_t>(row));
}

// The fused optimizers (tf_keras's formulas), for one row and its slots.
void ApplyOne(const OptimizerParams& p, int64_t dim, float alpha, float* w, const float* g) {
  const float lr = p.learning_rate;
  const float eps = p.epsilon;
  switch (p.kind) {
    case Optimizer::kSgd:
      for (int64_t j = 0; j < dim; ++j) w[j] -= lr * g[j];
      break;
    case Optimizer::kAdagrad: {
      float* acc = w + dim;
      for (int64_t j = 0; j < dim; ++j) {
        acc[j] += g[j] * g[j];
        w[j] -= lr * g[j] / (std::sqrt(acc[j]) + eps);
      }
      break;
    }
    case Optimizer::kAdam: {
      const float b1 = p.beta1, b2 = p.beta2;
      float* mom = w + dim;
      float* vel = w + 2 * dim;
      for (int64_t j = 0; j < dim; ++j) {
        mom[j] = b1 * mom[j] + (1.0f - b1) * g[j];
        vel[j] = b2 * vel[j] + (1.0f - b2) * g[j] * g[j];
        w[j] -= alpha * mom[j] / (std::sqrt(vel[j]) + eps);
      }
      break;
    }
  }
}

float AdamAlpha(const OptimizerParams& p) {
  const double t1 = static_cast<double>(p.step);
  return static_cast<float>(p.learning_rate * std::sqrt(1.0 - std::pow(p.beta2, t1)) /
                            (1.0 - std::pow(p.beta1, t1)));
}

}  // namespace

void InitialRow(const TableConfig& config, int64_t id, float* out) {
  const int64_t dim = config.dim;
  if (config.initializer == Initializer::kZeros) {
    std::fill(out, out + dim, 0.0f);
    return;
  }
  const uint64_t base = Mix64(static_cast<uint64_t>(id) ^ Mix64(config.seed));
  for (int64_t j = 0; j < dim; ++j) {
    const uint64_t r = Mix64(base + static_cast<uint64_t>(j) * 0x9E3779B97F4A7C15ULL);
    if (config.initializer == Initializer::kUniform) {
      const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
      out[j] = (2.0f * u - 1.0f) * config.init_scale;
    } else {
      const double u1 = (static_cast<double>(r >> 32) + 0.5) / 4294967296.0;  // (0, 1)
      const double u2 = static_cast<double>(r & 0xFFFFFFFFULL) / 4294967296.0;
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      out[j] = static_cast<float>(z) * config.init_scale;
    }
  }
}

// ---- a sub-table ----------------------------------------------------------------------

HashTable::Shard::Shard(int64_t row_stride) : stride(row_stride) {
  slots.assign(kInitialCapacity, Slot{0, kEmpty, 0, 0});
}

void HashTable::Shard::Rehash(int64_t new_capacity) {
  std::vector<Slot> old;
  old.swap(slots);
  slots.assign(new_capacity, Slot{0, kEmpty, 0, 0});
  const uint64_t mask = slots.size() - 1;
  for (const Slot& s : old) {
    if (s.row == kEmpty) continue;
    uint64_t i = Home(s.key);
    while (slots[i].row != kEmpty) i = (i + 1) & mask;
    slots[i] = s;
  }
}

void HashTable::Shard::Reserve(int64_t entries) {
  int64_t capacity = static_cast<int64_t>(slots.size());
  while (static_cast<double>(entries + 1) > kMaxLoad * static_cast<double>(capacity)) {
    capacity *= 2;
  }
  if (capacity != static_cast<int64_t>(slots.size())) Rehash(capacity);
}

int64_t HashTable::Shard::InsertAt(int64_t index, int64_t key) {
  slots[index] = Slot{key, kNoRow, 0, 0};
  ++num_entries;
  return index;
}

int64_t HashTable::Shard::FindOrInsert(int64_t key) {
  int64_t empty = 0;
  const int64_t found = Find(key, &empty);
  return found != kNotFound ? found : InsertAt(empty, key);
}

void HashTable::Shard::Erase(int64_t index) {
  FreeRow(slots[index].row);
  BackwardShiftErase(
      slots, static_cast<uint64_t>(index), [](const Slot& s) { return s.row == kEmpty; },
      [this](const Slot& s) { return Home(s.key); }, [](Slot& s) { s.row = kEmpty; });
  --num_entries;
}

int64_t HashTable::Shard::NewRow() {
  int64_t row;
  if (!free_rows.empty()) {
    row = free_rows.back();
    free_rows.pop_back();
  } else {
    row = rows_allocated++;
    if (row / kBlockRows >= static_cast<int64_t>(blocks.size())) {
      blocks.emplace_back(new float[kBlockRows * stride]);
    }
    if (row >= static_cast<int64_t>(apply_mark.size())) {
      apply_mark.resize(std::max<size_t>(64, 2 * apply_mark.size()), 0);
    }
  }
  ++num_rows_in_use;
  return row;
}

void HashTable::Shard::FreeRow(int64_t row) {
  if (row < 0) return;
  free_rows.push_back(row);
  --num_rows_in_use;
}

void HashTable::Shard::Clear() {
  slots.assign(kInitialCapacity, Slot{0, kEmpty, 0, 0});
  num_entries = 0;
  blocks.clear();
  apply_mark.clear();
  rows_allocated = 0;
  free_rows.clear();
  num_rows_in_use = 0;
}

// ---- the table --------------------------------------------------------------------------

HashTable::HashTable(const TableConfig& config) : config_(config) {
  for (int64_t s = 0; s < kNumShards; ++s) shards_.emplace_back(new Shard(stride()));
  if (config_.cache_capacity > 0) {
    cache_.reset(new Cache(config_.cache_capacity, config_.cache_min_count, stride()));
  }
}

HashTable::~HashTable() = default;

int64_t HashTable::Size() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& s : shards_) n += s->num_entries;
  return n;
}

int64_t HashTable::AdmittedSize() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& s : shards_) n += s->num_rows_in_use;
  return n;
}

int64_t HashTable::IndexCapacity() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& s : shards_) n += static_cast<int64_t>(s->slots.size());
  return n;
}

void HashTable::GroupByShard(const int64_t* ids, const int64_t* counts, int64_t n,
                             const ParallelFor& pfor) {
  Grouping& g = grouping_;
  g.begin.resize(kNumShards + 1);
  int32_t* order = Sized(g.order, n);
  int64_t* key = Sized(g.key, n);
  int64_t* count = counts ? Sized(g.count, n) : nullptr;
  StableBucketSort(
      n, kNumShards, [ids](int64_t i) { return ShardOf(ids[i]); },
      [&](int64_t i, int64_t k) {
        order[k] = static_cast<int32_t>(i);
        key[k] = ids[i];
        if (counts) count[k] = counts[i];
      },
      g.begin.data(), &g.chunk_offset, pfor);
}

void HashTable::InitRow(float* row, int64_t key) const {
  InitialRow(config_, key, row);
  std::fill(row + config_.dim, row + stride(), config_.slot_init);
}

void HashTable::LookupOrInsert(const int64_t* ids, const int64_t* counts, int64_t n,
                               int64_t step, float* values, int64_t* handles,
                               const ParallelFor& pfor) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (cache_) {
    CacheLookup(ids, counts, n, step, values, handles, pfor);
  } else {
    LookupOrInsertInTable(ids, counts, n, step, values, handles, nullptr, pfor);
  }
}

void HashTable::LookupOrInsertInTable(const int64_t* ids, const int64_t* counts, int64_t n,
                                      int64_t step, float* values, int64_t* handles,
                                      int64_t* freq_out, const ParallelFor& pfor) {
  const int64_t dim = config_.dim;
  const uint64_t generation = generation_;
  GroupByShard(ids, counts, n, pfor);
  const int32_t* order = grouping_.order.data();
  const int64_t* begin = grouping_.begin.data();
  const int64_t* key = grouping_.key.data();
  const int64_t* count = grouping_.count.data();
  // One task per sub-table. Within it, the ids in call order: first the ids known when the
  // call began have their counts added (and rows read), then the others are inserted in
  // order, and entries without a row are admitted once their frequency reaches the bar.
  const int64_t per_shard = n / kNumShards + 1;
  pfor(kNumShards, per_shard * (200 + 4 * dim), [&](int64_t first, int64_t last) {
    struct Pending {
      int64_t k;      // position in order
      int64_t index;  // the entry (known ids) or where its probe found an empty entry
      bool known;
    };
    std::vector<Pending> pending;
    for (int64_t s = first; s < last; ++s) {
      Shard& shard = *shards_[s];
      const int64_t lo = begin[s], hi = begin[s + 1];
      if (lo == hi) continue;
      shard.Reserve(shard.num_entries + (hi - lo));  // no rehash until the call ends
      pending.clear();
      constexpr int64_t kRowAhead = kPrefetchDistance / 2;
      for (int64_t k = lo; k < hi; ++k) {
        if (k + kPrefetchDistance < hi) {
          shard.PrefetchHome(key[k + kPrefetchDistance]);
          __builtin_prefetch(values + order[k + kPrefetchDistance] * dim, 1);
        }
        if (k + kRowAhead < hi) {
          // Its home entry was fetched kRowAhead ids ago: when the id sits there with a
          // row, fetch the row too (a guess; a miss costs nothing but the prefetch).
          const int64_t ahead = key[k + kRowAhead];
          const Shard::Slot& home = shard.slots[shard.Home(ahead)];
          if (home.row >= 0 && home.key == ahead) __builtin_prefetch(shard.RowPtr(home.row));
        }
        const int64_t i = order[k];
        int64_t empty = 0;
        const int64_t e = shard.Find(key[k], &empty);
        if (e == Shard::kNotFound) {
          pending.push_back({k, empty, false});
          continue;
        }
        Shard::Slot& slot = shard.slots[e];
        slot.freq += counts ? count[k] : int64_t{1};
        slot.last_seen = step;
        if (freq_out) freq_out[i] = slot.freq;
        if (slot.row >= 0) {
          std::memcpy(values + i * dim, shard.RowPtr(slot.row), dim * sizeof(float));
          if (handles) handles[i] = MakeHandle(generation, s, slot.row);
        } else {
          pending.push_back({k, e, true});
        }
      }
      const size_t num_pending = pending.size();
      for (size_t q = 0; q < num_pending; ++q) {
        if (q + kPrefetchDistance < num_pending) {
          __builtin_prefetch(&shard.slots[pending[q + kPrefetchDistance].index], 1);
        }
        if (q + kPrefetchDistance / 2 < num_pending) {
          __builtin_prefetch(values + order[pending[q + kPrefetchDistance / 2].k] * dim, 1);
        }
        const Pending& p = pending[q];
        const int64_t i = order[p.k];
        int64_t e = p.index;
        if (!p.known) {
          // The probe's empty entry is still free unless an earlier id of this call took
          // it; then probe again (the id may have been inserted by its own duplicate).
          e = shard.slots[e].row == Shard::kEmpty ? shard.InsertAt(e, key[p.k])
                                                   : shard.FindOrInsert(key[p.k]);
          Shard::Slot& slot = shard.slots[e];
          slot.freq += counts ? count[p.k] : int64_t{1};
          slot.last_seen = step;
          if (freq_out) freq_out[i] = slot.freq;
        }
        Shard::Slot& slot = shard.slots[e];
        if (slot.row < 0 && slot.freq >= config_.admit_after) {
          slot.row = shard.NewRow();
          InitRow(shard.RowPtr(slot.row), key[p.k]);
        }
        float* out = values + i * dim;
        if (slot.row >= 0) {
          std::memcpy(out, shard.RowPtr(slot.row), dim * sizeof(float));
          if (handles) handles[i] = MakeHandle(generation, s, slot.row);
        } else {
          std::fill(out, out + dim, config_.default_value);
          if (handles) handles[i] = kNoHandle;
        }
      }
    }
  });
}

bool HashTable::ReadEntry(int64_t key, const float** row, int64_t* freq,
                          int64_t* last_seen) const {
  const Shard& shard = *shards_[ShardOf(key)];
  const int64_t e = shard.Find(key);
  if (e == Shard::kNotFound) return false;
  const Shard::Slot& slot = shard.slots[e];
  *row = slot.row >= 0 ? shard.RowPtr(slot.row) : nullptr;
  *freq = slot.freq;
  *last_seen = slot.last_seen;
  return true;
}

void HashTable::Lookup(const int64_t* ids, int64_t n, float* values, bool* found,
                       const ParallelFor& pfor) const {
  const int64_t dim = config_.dim;
  std::shared_lock<std::shared_mutex> lock(mu_);
  pfor(n, 50 + 2 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchDistance < end) {
        const int64_t ahead = ids[i + kPrefetchDistance];
        shards_[ShardOf(ahead)]->PrefetchHome(ahead);
      }
      const float* row = nullptr;
      const int32_t cached = cache_ ? cache_->Find(ids[i]) : Cache::kFree;
      if (cached != Cache::kFree) {
        row = cache_->Row(cached);
      } else {
        int64_t freq, last_seen;
        ReadEntry(ids[i], &row, &freq, &last_seen);
      }
      float* out = values + i * dim;
      if (row) {
        std::memcpy(out, row, dim * sizeof(float));
      } else {
        std::fill(out, out + dim, config_.default_value);
      }
      if (found) found[i] = row != nullptr;
    }
  });
}

struct HashTable::Target {
  float* row;
  const float* grad;
};

int64_t HashTable::ApplyGradients(const int64_t* ids, const int64_t* handles,
                                  const float* grads, int64_t n,
                                  const OptimizerParams& params, const ParallelFor& pfor) {
  const int64_t dim = config_.dim;
  std::unique_lock<std::shared_mutex> lock(mu_);
  // Duplicate detection: a per-row mark stamped with this call's epoch finds duplicates
  // in O(n) with no per-call allocation.
  if (++apply_epoch_ == (uint64_t{1} << 32)) {
    for (auto& s : shards_) std::fill(s->apply_mark.begin(), s->apply_mark.end(), 0);
    if (cache_) std::fill(cache_->apply_mark.begin(), cache_->apply_mark.end(), 0);
    apply_epoch_ = 1;
  }
  const uint64_t epoch = apply_epoch_;
  const uint64_t generation = generation_ & kGenerationMask;
  const float alpha = params.kind == Optimizer::kAdam ? AdamAlpha(params) : 0.0f;
  GroupByShard(ids, nullptr, n, pfor);
  const int32_t* order = grouping_.order.data();
  const int64_t* begin = grouping_.begin.data();
  const int64_t* key = grouping_.key.data();
  std::atomic<int64_t> updated{0};
  // One task per sub-table: an id and all its duplicates fall in the same one, so the
  // marks, the fold and the rows of a task are its own (a cached id's row included).
  const int64_t per_shard = n / kNumShards + 1;
  pfor(kNumShards, per_shard * (100 + 12 * dim), [&](int64_t first, int64_t last) {
    std::vector<Target> targets;
    std::vector<std::pair<int64_t, int64_t>> duplicates;  // (target, position)
    std::vector<float> folded;
    for (int64_t s = first; s < last; ++s) {
      Shard& shard = *shards_[s];
      targets.clear();
      duplicates.clear();
      const int64_t hi = begin[s + 1];
      // The row (and its mark) of a valid handle is known before probing: fetch the row's
      // lines and mark ahead of their use (rows are scattered over the arena).
      const auto handle_row = [&](int64_t i) -> int64_t {
        const int64_t h = handles ? handles[i] : kNoHandle;
        const uint64_t u = static_cast<uint64_t>(h);
        if (h >= 0 && (u >> kGenerationShift) == generation &&
            static_cast<int64_t>((u >> kRowBits) & (kNumShards - 1)) == s &&
            static_cast<int64_t>(u & kRowMask) < shard.rows_allocated) {
          return static_cast<int64_t>(u & kRowMask);
        }
        return Shard::kNoRow;
      };
      for (int64_t k = begin[s]; k < hi; ++k) {
        // Positions within a sub-table are scattered over the call's inputs: fetch the
        // handle two distances ahead, its row and mark one distance ahead.
        if (handles && k + 2 * kPrefetchDistance < hi) {
          __builtin_prefetch(&handles[order[k + 2 * kPrefetchDistance]]);
        }
        if (k + kPrefetchDistance < hi && !cache_) {
          const int64_t ahead = handle_row(order[k + kPrefetchDistance]);
          if (ahead >= 0) {
            const float* r = shard.RowPtr(ahead);
            for (int64_t j = 0; j < shard.stride; j += 16) __builtin_prefetch(r + j, 1);
            __builtin_prefetch(&shard.apply_mark[ahead], 1);
          }
        }
        const int64_t i = order[k];
        float* row = nullptr;
        uint64_t* mark = nullptr;
        const int32_t cached = cache_ ? cache_->Find(key[k]) : Cache::kFree;
        if (cached != Cache::kFree) {
          row = cache_->Row(cached);
          mark = &cache_->apply_mark[cached];
          cache_->dirty[cached] = 1;
        } else {
          int64_t r = handle_row(i);
          if (r == Shard::kNoRow) {
            const int64_t e = shard.Find(key[k]);
            if (e != Shard::kNotFound) r = shard.slots[e].row;
          }
          if (r < 0) continue;
          row = shard.RowPtr(r);
          mark = &shard.apply_mark[r];
        }
        if ((*mark >> 32) == epoch) {
          duplicates.emplace_back(static_cast<int64_t>(*mark & 0xFFFFFFFFULL), i);
          continue;
        }
        *mark = (epoch << 32) | static_cast<uint64_t>(targets.size());
        targets.push_back({row, grads + i * dim});
      }
      // Gradients of duplicated ids summed in order of appearance, first occurrence first.
      folded.clear();
      if (!duplicates.empty()) {
        std::vector<int64_t> folded_at(targets.size(), -1);
        for (const auto& [t, i] : duplicates) {
          if (folded_at[t] >= 0) continue;
          folded_at[t] = static_cast<int64_t>(folded.size());
          folded.insert(folded.end(), targets[t].grad, targets[t].grad + dim);
        }
        for (const auto& [t, i] : duplicates) {
          float* acc = folded.data() + folded_at[t];
          const float* g = grads + i * dim;
          for (int64_t j = 0; j < dim; ++j) acc[j] += g[j];
        }
        for (size_t t = 0; t < targets.size(); ++t) {
          if (folded_at[t] >= 0) targets[t].grad = folded.data() + folded_at[t];
        }
      }
      const size_t m = targets.size();
      for (size_t t = 0; t < m; ++t) {
        if (t + kPrefetchDistance < m) {  // the first pass's prefetches may be gone by now
          const Target& ahead = targets[t + kPrefetchDistance];
          for (int64_t j = 0; j < shard.stride; j += 16) __builtin_prefetch(ahead.row + j, 1);
          for (int64_t j = 0; j < dim; j += 16) __builtin_prefetch(ahead.grad + j);
        }
        ApplyOne(params, dim, alpha, targets[t].row, targets[t].grad);
      }
      updated += static_cast<int64_t>(targets.size());
    }
  });
  return updated.load();
}

std::vector<int64_t> HashTable::Evict(int64_t step, int64_t max_age, int64_t max_size) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (cache_) CacheFlushLocked();  // judge cached ids by their current last-seen step
  std::vector<std::pair<int64_t, int64_t>> live;  // (last_seen, key)
  std::vector<int64_t> doomed;
  const int64_t oldest_kept = step - max_age;
  for (const auto& shard : shards_) {
    for (const Shard::Slot& s : shard->slots) {
      if (s.row == Shard::kEmpty) continue;
      if (max_age >= 0 && s.last_seen < oldest_kept) {
        doomed.push_back(s.key);
      } else {
        live.emplace_back(s.last_seen, s.key);
      }
    }
  }
  if (max_size >= 0 && static_cast<int64_t>(live.size()) > max_size) {
    // Least recently seen first; ties broken by id so every rank and run agrees.
    const int64_t excess = static_cast<int64_t>(live.size()) - max_size;
    std::nth_element(live.begin(), live.begin() + excess, live.end());
    for (int64_t k = 0; k < excess; ++k) doomed.push_back(live[k].second);
  }
  for (int64_t key : doomed) {
    Shard& shard = *shards_[ShardOf(key)];
    shard.Erase(shard.Find(key));
  }
  std::sort(doomed.begin(), doomed.end());
  if (!doomed.empty()) {
    ++generation_;
    if (cache_) CacheDrop(doomed);
  }
  return doomed;
}

std::vector<int64_t> HashTable::MostFrequentLocked(int64_t k) const {
  std::vector<std::pair<int64_t, int64_t>> entries;  // (-freq, key): ascending = wanted order
  for (const auto& shard : shards_) {
    for (const Shard::Slot& s : shard->slots) {
      if (s.row >= 0) entries.emplace_back(-s.freq, s.key);
    }
  }
  const int64_t take = std::max<int64_t>(0, std::min<int64_t>(k, entries.size()));
  if (take < static_cast<int64_t>(entries.size())) {
    std::nth_element(entries.begin(), entries.begin() + take, entries.end());
  }
  std::sort(entries.begin(), entries.begin() + take);
  std::vector<int64_t> ids(take);
  for (int64_t i = 0; i < take; ++i) ids[i] = entries[i].second;
  return ids;
}

ExportedTable HashTable::Export() {
  // With a cache, the export writes it back first: exclusive; otherwise a pure read.
  std::unique_lock<std::shared_mutex> exclusive(mu_, std::defer_lock);
  std::shared_lock<std::shared_mutex> shared(mu_, std::defer_lock);
  if (cache_) {
    exclusive.lock();
    CacheFlushLocked();
  } else {
    shared.lock();
  }
  const int64_t dim = config_.dim;
  const int64_t sdim = config_.num_slots * dim;
  std::vector<std::pair<int64_t, const Shard::Slot*>> order;  // (key, entry)
  for (const auto& shard : shards_) {
    for (const Shard::Slot& s : shard->slots) {
      if (s.row != Shard::kEmpty) order.emplace_back(s.key, &s);
    }
  }
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  ExportedTable out;
  const size_t n = order.size();
  out.ids.resize(n);
  out.values.resize(n * dim);
  out.slots.resize(n * sdim);
  out.freq.resize(n);
  out.last_seen.resize(n);
  out.admitted.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Shard::Slot& s = *order[i].second;
    out.ids[i] = s.key;
    out.freq[i] = s.freq;
    out.last_seen[i] = s.last_seen;
    out.admitted[i] = s.row >= 0;
    if (s.row >= 0) {
      const float* p = shards_[ShardOf(s.key)]->RowPtr(s.row);
      std::copy(p, p + dim, out.values.begin() + i * dim);
      std::copy(p + dim, p + dim + sdim, out.slots.begin() + i * sdim);
    } else {
      std::fill(out.values.begin() + i * dim, out.values.begin() + (i + 1) * dim,
                config_.default_value);
      std::fill(out.slots.begin() + i * sdim, out.slots.begin() + (i + 1) * sdim,
                config_.slot_init);
    }
  }
  return out;
}

void HashTable::ClearLocked() {
  for (auto& shard : shards_) shard->Clear();
}

void HashTable::WriteEntries(const int64_t* ids, const float* rows, const int64_t* freq,
                             const int64_t* last_seen, int64_t n) {
  const int64_t width = stride();
  for (int64_t i = 0; i < n; ++i) {
    Shard& shard = *shards_[ShardOf(ids[i])];
    shard.Reserve(shard.num_entries + 1);
    Shard::Slot& slot = shard.slots[shard.FindOrInsert(ids[i])];
    slot.freq = freq[i];
    slot.last_seen = last_seen[i];
    if (slot.row < 0) slot.row = shard.NewRow();
    std::copy(rows + i * width, rows + (i + 1) * width, shard.RowPtr(slot.row));
  }
}

int64_t HashTable::Import(const int64_t* ids, const float* values, const float* slots,
                          const int64_t* freq, const int64_t* last_seen,
                          const uint8_t* admitted, int64_t n, bool clear_first,
                          int64_t shard_index, int64_t num_shards) {
  const int64_t dim = config_.dim;
  const int64_t sdim = config_.num_slots * dim;
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (cache_) {
    // Cached rows must not shadow what is imported: write them back, then forget them.
    CacheFlushLocked();
    CacheClear();
  }
  ++generation_;
  if (clear_first) ClearLocked();
  int64_t imported = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (num_shards > 1 && OwnerOf(ids[i], num_shards) != shard_index) continue;
    Shard& shard = *shards_[ShardOf(ids[i])];
    shard.Reserve(shard.num_entries + 1);
    Shard::Slot& slot = shard.slots[shard.FindOrInsert(ids[i])];
    slot.freq = freq[i];
    slot.last_seen = last_seen[i];
    if (admitted[i]) {
      if (slot.row < 0) slot.row = shard.NewRow();
      float* p = shard.RowPtr(slot.row);
      std::copy(values + i * dim, values + (i + 1) * dim, p);
      std::copy(slots + i * sdim, slots + (i + 1) * sdim, p + dim);
    } else {
      shard.FreeRow(slot.row);
      slot.row = Shard::kNoRow;
    }
    ++imported;
  }
  return imported;
}

std::string HashTable::DebugString() const {
  std::ostringstream s;
  s << "gmeta HashTable(dim=" << config_.dim << ", slots=" << config_.num_slots
    << ", ids=" << Size() << ", rows=" << AdmittedSize()
    << ", index_capacity=" << IndexCapacity();
  if (cache_) s << ", cache=" << GetCacheStats().size << "/" << config_.cache_capacity;
  s << ")";
  return s.str();
}

}  // namespace gmeta
