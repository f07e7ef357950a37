#include "hash_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <sstream>

namespace gmeta {
namespace {

constexpr int64_t kInitialCapacity = 1024;
constexpr double kMaxLoad = 0.7;

int64_t NextPow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

template <typename T>
void AtomicAdd(T* p, T v) {
  __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
template <typename T>
T AtomicLoad(const T* p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
template <typename T>
void AtomicStore(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

// Memory latency, not arithmetic, bounds hash-table work on large tables: loops prefetch
// the home slot of the id this many positions ahead.
constexpr int64_t kPrefetchDistance = 8;

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

HashTable::HashTable(const TableConfig& config) : config_(config) {
  slots_.assign(kInitialCapacity, Slot{0, kEmpty, 0, 0});
}

int64_t HashTable::Size() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return num_entries_;
}

int64_t HashTable::AdmittedSize() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return num_rows_in_use_;
}

int64_t HashTable::IndexCapacity() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return static_cast<int64_t>(slots_.size());
}

int64_t HashTable::FindSlot(int64_t key) const {
  const uint64_t mask = slots_.size() - 1;
  for (uint64_t i = Home(key);; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.row == kEmpty) return kNotFound;
    if (s.key == key) return static_cast<int64_t>(i);
  }
}

void HashTable::Rehash(int64_t new_capacity) {
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(new_capacity, Slot{0, kEmpty, 0, 0});
  const uint64_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.row == kEmpty) continue;
    uint64_t i = Home(s.key);
    while (slots_[i].row != kEmpty) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void HashTable::Reserve(int64_t entries) {
  int64_t capacity = static_cast<int64_t>(slots_.size());
  while (static_cast<double>(entries + 1) > kMaxLoad * static_cast<double>(capacity)) {
    capacity *= 2;
  }
  if (capacity != static_cast<int64_t>(slots_.size())) Rehash(capacity);
}

int64_t HashTable::FindOrInsertSlot(int64_t key) {
  Reserve(num_entries_ + 1);
  const uint64_t mask = slots_.size() - 1;
  uint64_t i = Home(key);
  for (; slots_[i].row != kEmpty; i = (i + 1) & mask) {
    if (slots_[i].key == key) return static_cast<int64_t>(i);
  }
  slots_[i] = Slot{key, kNoRow, 0, 0};
  ++num_entries_;
  return static_cast<int64_t>(i);
}

void HashTable::EraseSlot(int64_t slot) {
  FreeRow(slots_[slot].row);
  // Backward-shift deletion: pull later members of the probe run into the hole so
  // lookups never need tombstones.
  const uint64_t mask = slots_.size() - 1;
  uint64_t i = static_cast<uint64_t>(slot);
  uint64_t j = i;
  while (true) {
    j = (j + 1) & mask;
    if (slots_[j].row == kEmpty) break;
    const uint64_t k = Home(slots_[j].key);
    const bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
    if (!stays) {
      slots_[i] = slots_[j];
      i = j;
    }
  }
  slots_[i].row = kEmpty;
  --num_entries_;
}

int64_t HashTable::NewRow() {
  int64_t row;
  if (!free_rows_.empty()) {
    row = free_rows_.back();
    free_rows_.pop_back();
  } else {
    row = rows_allocated_++;
    if (row / kBlockRows >= static_cast<int64_t>(blocks_.size())) {
      blocks_.emplace_back(new float[kBlockRows * stride()]);
      apply_mark_.resize(blocks_.size() * kBlockRows, 0);
    }
  }
  ++num_rows_in_use_;
  return row;
}

void HashTable::FreeRow(int64_t row) {
  if (row < 0) return;
  free_rows_.push_back(row);
  --num_rows_in_use_;
}

void HashTable::InitRow(int64_t row, int64_t key) {
  float* p = RowPtr(row);
  InitialRow(config_, key, p);
  std::fill(p + config_.dim, p + stride(), config_.slot_init);
}

void HashTable::LookupOrInsert(const int64_t* ids, const int64_t* counts, int64_t n,
                               int64_t step, float* values, const ParallelFor& pfor,
                               int64_t* freq_out) {
  const int64_t dim = config_.dim;
  // 0: done; 1: id absent; 2: present without a row (may cross the admission bar).
  std::vector<uint8_t> pending(n, 0);
  std::atomic<int64_t> num_pending{0};
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    pfor(n, 50 + 2 * dim, [&](int64_t begin, int64_t end) {
      int64_t local = 0;
      for (int64_t i = begin; i < end; ++i) {
        if (i + kPrefetchDistance < end) PrefetchHome(ids[i + kPrefetchDistance]);
        const int64_t s = FindSlot(ids[i]);
        if (s == kNotFound) {
          pending[i] = 1;
          ++local;
          continue;
        }
        Slot& slot = const_cast<Slot&>(slots_[s]);
        const int64_t c = counts ? counts[i] : int64_t{1};
        const int64_t before = __atomic_fetch_add(&slot.freq, c, __ATOMIC_RELAXED);
        if (freq_out) freq_out[i] = before + c;
        AtomicStore(&slot.last_seen, step);
        if (slot.row >= 0) {
          std::memcpy(values + i * dim, RowPtr(slot.row), dim * sizeof(float));
        } else {
          pending[i] = 2;
          ++local;
        }
      }
      if (local) num_pending += local;
    });
  }
  if (num_pending.load() == 0) return;

  std::unique_lock<std::shared_mutex> lock(mu_);
  int64_t absent = 0;
  for (int64_t i = 0; i < n; ++i) absent += pending[i] == 1;
  Reserve(num_entries_ + absent);
  // Serial: only the structure (index and row allocation). Row initialization and the
  // copies, the costly part, run in parallel afterwards.
  std::vector<int64_t> pending_pos, pending_row;
  std::vector<int64_t> fresh_row, fresh_key;
  pending_pos.reserve(num_pending.load());
  pending_row.reserve(num_pending.load());
  std::vector<int64_t> todo;
  todo.reserve(num_pending.load());
  for (int64_t i = 0; i < n; ++i) {
    if (pending[i]) todo.push_back(i);
  }
  for (size_t k = 0; k < todo.size(); ++k) {
    if (k + kPrefetchDistance < todo.size()) PrefetchHome(ids[todo[k + kPrefetchDistance]]);
    const int64_t i = todo[k];
    const int64_t s = FindOrInsertSlot(ids[i]);
    if (pending[i] == 1) {
      slots_[s].freq += counts ? counts[i] : 1;
      slots_[s].last_seen = step;
      if (freq_out) freq_out[i] = slots_[s].freq;
    }
    Slot& slot = slots_[s];
    if (slot.row < 0 && slot.freq >= config_.admit_after) {
      slot.row = NewRow();
      fresh_row.push_back(slot.row);
      fresh_key.push_back(ids[i]);
    }
    pending_pos.push_back(i);
    pending_row.push_back(slot.row);
  }
  pfor(static_cast<int64_t>(fresh_row.size()), 20 * stride(), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) InitRow(fresh_row[k], fresh_key[k]);
  });
  pfor(static_cast<int64_t>(pending_pos.size()), 2 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      float* out = values + pending_pos[k] * dim;
      if (pending_row[k] >= 0) {
        std::memcpy(out, RowPtr(pending_row[k]), dim * sizeof(float));
      } else {
        std::fill(out, out + dim, config_.default_value);
      }
    }
  });
}

void HashTable::Lookup(const int64_t* ids, int64_t n, float* values, bool* found,
                       const ParallelFor& pfor) const {
  const int64_t dim = config_.dim;
  std::shared_lock<std::shared_mutex> lock(mu_);
  pfor(n, 50 + 2 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchDistance < end) PrefetchHome(ids[i + kPrefetchDistance]);
      const int64_t s = FindSlot(ids[i]);
      const int64_t row = s == kNotFound ? kNoRow : slots_[s].row;
      float* out = values + i * dim;
      if (row >= 0) {
        std::memcpy(out, RowPtr(row), dim * sizeof(float));
      } else {
        std::fill(out, out + dim, config_.default_value);
      }
      if (found) found[i] = row >= 0;
    }
  });
}

int64_t HashTable::ApplyGradients(const int64_t* ids, const float* grads, int64_t n,
                                  const OptimizerParams& params, const ParallelFor& pfor) {
  const int64_t dim = config_.dim;
  std::unique_lock<std::shared_mutex> lock(mu_);

  // Find every id's row in parallel (the index is read-only here).
  std::vector<int64_t> row_of(n);
  pfor(n, 50, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchDistance < end) PrefetchHome(ids[i + kPrefetchDistance]);
      const int64_t s = FindSlot(ids[i]);
      row_of[i] = s == kNotFound ? kNoRow : slots_[s].row;
    }
  });
  // Fold duplicated ids: one target per distinct row, gradients summed. A per-row mark
  // stamped with this call's epoch finds duplicates in O(n) with no per-call allocation.
  if (++apply_epoch_ == (uint64_t{1} << 32)) {
    std::fill(apply_mark_.begin(), apply_mark_.end(), 0);
    apply_epoch_ = 1;
  }
  std::vector<int64_t> target_row;
  std::vector<const float*> target_grad;
  target_row.reserve(n);
  target_grad.reserve(n);
  std::vector<std::pair<int64_t, int64_t>> duplicates;  // (target, position)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = row_of[i];
    if (row < 0) continue;
    const uint64_t mark = apply_mark_[row];
    if ((mark >> 32) == apply_epoch_) {
      duplicates.emplace_back(static_cast<int64_t>(mark & 0xFFFFFFFFULL), i);
      continue;
    }
    apply_mark_[row] = (apply_epoch_ << 32) | static_cast<uint64_t>(target_row.size());
    target_row.push_back(row);
    target_grad.push_back(grads + i * dim);
  }
  std::vector<float> folded;  // summed gradients of duplicated ids
  if (!duplicates.empty()) {
    std::vector<int64_t> folded_at(target_row.size(), -1);
    for (const auto& [t, i] : duplicates) {
      if (folded_at[t] >= 0) continue;
      folded_at[t] = static_cast<int64_t>(folded.size());
      folded.insert(folded.end(), target_grad[t], target_grad[t] + dim);
    }
    for (const auto& [t, i] : duplicates) {
      float* acc = folded.data() + folded_at[t];
      const float* g = grads + i * dim;
      for (int64_t j = 0; j < dim; ++j) acc[j] += g[j];
    }
    for (size_t t = 0; t < target_row.size(); ++t) {
      if (folded_at[t] >= 0) target_grad[t] = folded.data() + folded_at[t];
    }
  }

  const int64_t m = static_cast<int64_t>(target_row.size());
  const float lr = params.learning_rate;
  const float eps = params.epsilon;
  switch (params.kind) {
    case Optimizer::kSgd:
      pfor(m, 2 * dim, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          float* w = RowPtr(target_row[t]);
          const float* g = target_grad[t];
          for (int64_t j = 0; j < dim; ++j) w[j] -= lr * g[j];
        }
      });
      break;
    case Optimizer::kAdagrad:
      pfor(m, 8 * dim, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          float* w = RowPtr(target_row[t]);
          float* acc = w + dim;
          const float* g = target_grad[t];
          for (int64_t j = 0; j < dim; ++j) {
            acc[j] += g[j] * g[j];
            w[j] -= lr * g[j] / (std::sqrt(acc[j]) + eps);
          }
        }
      });
      break;
    case Optimizer::kAdam: {
      const double t1 = static_cast<double>(params.step);
      const float b1 = params.beta1, b2 = params.beta2;
      const float alpha = static_cast<float>(lr * std::sqrt(1.0 - std::pow(b2, t1)) /
                                             (1.0 - std::pow(b1, t1)));
      pfor(m, 12 * dim, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          float* w = RowPtr(target_row[t]);
          float* mom = w + dim;
          float* vel = w + 2 * dim;
          const float* g = target_grad[t];
          for (int64_t j = 0; j < dim; ++j) {
            mom[j] = b1 * mom[j] + (1.0f - b1) * g[j];
            vel[j] = b2 * vel[j] + (1.0f - b2) * g[j] * g[j];
            w[j] -= alpha * mom[j] / (std::sqrt(vel[j]) + eps);
          }
        }
      });
      break;
    }
  }
  return m;
}

std::vector<int64_t> HashTable::Evict(int64_t step, int64_t max_age, int64_t max_size) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  std::vector<int64_t> live, doomed;  // keys
  live.reserve(num_entries_);
  const int64_t oldest_kept = step - max_age;
  for (const Slot& s : slots_) {
    if (s.row == kEmpty) continue;
    if (max_age >= 0 && s.last_seen < oldest_kept) {
      doomed.push_back(s.key);
    } else {
      live.push_back(s.key);
    }
  }
  if (max_size >= 0 && static_cast<int64_t>(live.size()) > max_size) {
    // Least recently seen first; ties broken by id so every rank and run agrees.
    std::vector<std::pair<int64_t, int64_t>> by_age;  // (last_seen, key)
    by_age.reserve(live.size());
    for (int64_t key : live) by_age.emplace_back(slots_[FindSlot(key)].last_seen, key);
    const int64_t excess = static_cast<int64_t>(live.size()) - max_size;
    std::nth_element(by_age.begin(), by_age.begin() + excess, by_age.end());
    for (int64_t k = 0; k < excess; ++k) doomed.push_back(by_age[k].second);
  }
  for (int64_t key : doomed) EraseSlot(FindSlot(key));
  std::sort(doomed.begin(), doomed.end());
  return doomed;
}

void HashTable::ReadEntries(const int64_t* ids, int64_t n, float* values, float* slots,
                            int64_t* freq, int64_t* last_seen, bool* found,
                            const ParallelFor& pfor) const {
  const int64_t dim = config_.dim;
  const int64_t sdim = config_.num_slots * dim;
  std::shared_lock<std::shared_mutex> lock(mu_);
  pfor(n, 50 + 4 * stride(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchDistance < end) PrefetchHome(ids[i + kPrefetchDistance]);
      const int64_t s = FindSlot(ids[i]);
      // Counters may be bumped concurrently by a shared-locked LookupOrInsert: atomic reads.
      freq[i] = s == kNotFound ? 0 : AtomicLoad(&slots_[s].freq);
      last_seen[i] = s == kNotFound ? 0 : AtomicLoad(&slots_[s].last_seen);
      const int64_t row = s == kNotFound ? kNoRow : slots_[s].row;
      found[i] = row >= 0;
      if (row >= 0) {
        const float* p = RowPtr(row);
        std::memcpy(values + i * dim, p, dim * sizeof(float));
        std::memcpy(slots + i * sdim, p + dim, sdim * sizeof(float));
      } else {
        std::fill(values + i * dim, values + (i + 1) * dim, config_.default_value);
        std::fill(slots + i * sdim, slots + (i + 1) * sdim, config_.slot_init);
      }
    }
  });
}

std::vector<int64_t> HashTable::MostFrequent(int64_t k) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<std::pair<int64_t, int64_t>> entries;  // (-freq, key): ascending = wanted order
  entries.reserve(num_rows_in_use_);
  for (const Slot& s : slots_) {
    if (s.row >= 0) entries.emplace_back(-AtomicLoad(&s.freq), s.key);
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

ExportedTable HashTable::Export() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const int64_t dim = config_.dim;
  const int64_t sdim = config_.num_slots * dim;
  std::vector<std::pair<int64_t, int64_t>> order;  // (key, slot)
  order.reserve(num_entries_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].row != kEmpty) order.emplace_back(slots_[i].key, static_cast<int64_t>(i));
  }
  std::sort(order.begin(), order.end());
  ExportedTable out;
  const size_t n = order.size();
  out.ids.resize(n);
  out.values.resize(n * dim);
  out.slots.resize(n * sdim);
  out.freq.resize(n);
  out.last_seen.resize(n);
  out.admitted.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Slot& s = slots_[order[i].second];
    out.ids[i] = s.key;
    out.freq[i] = s.freq;
    out.last_seen[i] = s.last_seen;
    out.admitted[i] = s.row >= 0;
    if (s.row >= 0) {
      const float* p = RowPtr(s.row);
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
  slots_.assign(kInitialCapacity, Slot{0, kEmpty, 0, 0});
  num_entries_ = 0;
  blocks_.clear();
  apply_mark_.clear();
  rows_allocated_ = 0;
  free_rows_.clear();
  num_rows_in_use_ = 0;
}

int64_t HashTable::Import(const int64_t* ids, const float* values, const float* slots,
                          const int64_t* freq, const int64_t* last_seen,
                          const uint8_t* admitted, int64_t n, bool clear_first,
                          int64_t shard_index, int64_t num_shards) {
  const int64_t dim = config_.dim;
  const int64_t sdim = config_.num_slots * dim;
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (clear_first) ClearLocked();
  int64_t imported = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (num_shards > 1 && OwnerOf(ids[i], num_shards) != shard_index) continue;
    Slot& slot = slots_[FindOrInsertSlot(ids[i])];
    slot.freq = freq[i];
    slot.last_seen = last_seen[i];
    if (admitted[i]) {
      if (slot.row < 0) slot.row = NewRow();
      float* p = RowPtr(slot.row);
      std::copy(values + i * dim, values + (i + 1) * dim, p);
      std::copy(slots + i * sdim, slots + (i + 1) * sdim, p + dim);
    } else {
      FreeRow(slot.row);
      slot.row = kNoRow;
    }
    ++imported;
  }
  return imported;
}

std::string HashTable::DebugString() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::ostringstream s;
  s << "gmeta HashTable(dim=" << config_.dim << ", slots=" << config_.num_slots
    << ", ids=" << num_entries_ << ", rows=" << num_rows_in_use_
    << ", index_capacity=" << slots_.size() << ")";
  return s.str();
}

void Dedup(const int64_t* ids, int64_t n, int64_t num_partitions, DedupResult* out) {
  // A thread-local map reused across calls: a slot is live when its epoch is this
  // call's, so nothing needs clearing between batches.
  struct DedupSlot {
    int64_t key;
    uint32_t epoch;
    int32_t index;
  };
  thread_local std::vector<DedupSlot> map;
  thread_local uint32_t epoch = 0;
  const int64_t capacity = NextPow2(std::max<int64_t>(16, 2 * n));
  if (static_cast<int64_t>(map.size()) < capacity || ++epoch == 0) {
    map.assign(std::max<int64_t>(capacity, static_cast<int64_t>(map.size())),
               DedupSlot{0, 0, 0});
    epoch = 1;
  }
  const uint64_t mask = map.size() - 1;

  out->unique_ids.clear();
  out->counts.clear();
  out->inverse.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n) {
      __builtin_prefetch(&map[Mix64(static_cast<uint64_t>(ids[i + kPrefetchDistance])) & mask]);
    }
    const int64_t id = ids[i];
    uint64_t h = Mix64(static_cast<uint64_t>(id)) & mask;
    while (true) {
      DedupSlot& slot = map[h];
      if (slot.epoch != epoch) {
        const int32_t nu = static_cast<int32_t>(out->unique_ids.size());
        slot = DedupSlot{id, epoch, nu};
        out->unique_ids.push_back(id);
        out->counts.push_back(1);
        out->inverse[i] = nu;
        break;
      }
      if (slot.key == id) {
        ++out->counts[slot.index];
        out->inverse[i] = slot.index;
        break;
      }
      h = (h + 1) & mask;
    }
  }

  const int64_t parts = std::max<int64_t>(1, num_partitions);
  out->splits.assign(parts, 0);
  const int64_t u = static_cast<int64_t>(out->unique_ids.size());
  if (parts == 1) {
    out->splits[0] = u;
    return;
  }
  // Stable counting sort of the unique ids by owner.
  std::vector<int64_t> owner(u);
  for (int64_t k = 0; k < u; ++k) {
    owner[k] = OwnerOf(out->unique_ids[k], parts);
    ++out->splits[owner[k]];
  }
  std::vector<int64_t> offset(parts, 0);
  for (int64_t p = 1; p < parts; ++p) offset[p] = offset[p - 1] + out->splits[p - 1];
  std::vector<int32_t> new_pos(u);
  std::vector<int64_t> ids_sorted(u), counts_sorted(u);
  for (int64_t k = 0; k < u; ++k) {
    const int64_t pos = offset[owner[k]]++;
    new_pos[k] = static_cast<int32_t>(pos);
    ids_sorted[pos] = out->unique_ids[k];
    counts_sorted[pos] = out->counts[k];
  }
  out->unique_ids.swap(ids_sorted);
  out->counts.swap(counts_sorted);
  for (int64_t i = 0; i < n; ++i) out->inverse[i] = new_pos[out->inverse[i]];
}

}  // namespace gmeta
