#include "hash_table.h"

#include <algorithm>
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
  slots_.assign(kInitialCapacity, Slot{0, kEmpty});
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

int64_t HashTable::FindEntry(int64_t key) const {
  const uint64_t mask = slots_.size() - 1;
  for (uint64_t i = Home(key);; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.entry == kEmpty) return kEmpty;
    if (s.key == key) return s.entry;
  }
}

void HashTable::Rehash(int64_t new_capacity) {
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(new_capacity, Slot{0, kEmpty});
  const uint64_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.entry == kEmpty) continue;
    uint64_t i = Home(s.key);
    while (slots_[i].entry != kEmpty) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void HashTable::MaybeGrow() {
  if (static_cast<double>(num_entries_ + 1) > kMaxLoad * static_cast<double>(slots_.size())) {
    Rehash(static_cast<int64_t>(slots_.size()) * 2);
  }
}

int64_t HashTable::InsertEntry(int64_t key) {
  MaybeGrow();
  int64_t entry;
  if (!free_entries_.empty()) {
    entry = free_entries_.back();
    free_entries_.pop_back();
  } else {
    entry = static_cast<int64_t>(entry_key_.size());
    entry_key_.push_back(0);
    entry_freq_.push_back(0);
    entry_last_.push_back(0);
    entry_row_.push_back(-1);
  }
  entry_key_[entry] = key;
  entry_freq_[entry] = 0;
  entry_last_[entry] = 0;
  entry_row_[entry] = -1;
  const uint64_t mask = slots_.size() - 1;
  uint64_t i = Home(key);
  while (slots_[i].entry != kEmpty) i = (i + 1) & mask;
  slots_[i] = Slot{key, entry};
  ++num_entries_;
  return entry;
}

void HashTable::EraseEntry(int64_t entry) {
  const int64_t key = entry_key_[entry];
  const uint64_t mask = slots_.size() - 1;
  uint64_t i = Home(key);
  while (slots_[i].entry != entry) i = (i + 1) & mask;
  // Backward-shift deletion: pull later members of the probe run into the hole so
  // lookups never need tombstones.
  uint64_t j = i;
  while (true) {
    j = (j + 1) & mask;
    if (slots_[j].entry == kEmpty) break;
    const uint64_t k = Home(slots_[j].key);
    const bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
    if (!stays) {
      slots_[i] = slots_[j];
      i = j;
    }
  }
  slots_[i].entry = kEmpty;
  --num_entries_;
  if (entry_row_[entry] >= 0) {
    free_rows_.push_back(entry_row_[entry]);
    --num_rows_in_use_;
  }
  entry_row_[entry] = -1;
  free_entries_.push_back(entry);
}

int64_t HashTable::AllocateRow(int64_t key) {
  int64_t row;
  if (!free_rows_.empty()) {
    row = free_rows_.back();
    free_rows_.pop_back();
  } else {
    row = rows_allocated_++;
    if (row / kBlockRows >= static_cast<int64_t>(blocks_.size())) {
      blocks_.emplace_back(new float[kBlockRows * stride()]);
    }
  }
  ++num_rows_in_use_;
  float* p = RowPtr(row);
  InitialRow(config_, key, p);
  std::fill(p + config_.dim, p + stride(), config_.slot_init);
  return row;
}

void HashTable::LookupOrInsert(const int64_t* ids, const int64_t* counts, int64_t n,
                               int64_t step, float* values, const ParallelFor& pfor) {
  const int64_t dim = config_.dim;
  // 0: done; 1: id absent; 2: present without a row (may cross the admission bar).
  std::vector<uint8_t> pending(n, 0);
  bool any_pending = false;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    std::mutex flag_mu;
    pfor(n, 50 + 2 * dim, [&](int64_t begin, int64_t end) {
      bool local = false;
      for (int64_t i = begin; i < end; ++i) {
        const int64_t e = FindEntry(ids[i]);
        if (e == kEmpty) {
          pending[i] = 1;
          local = true;
          continue;
        }
        AtomicAdd(&entry_freq_[e], counts ? counts[i] : int64_t{1});
        AtomicStore(&entry_last_[e], step);
        const int64_t row = entry_row_[e];
        if (row >= 0) {
          std::memcpy(values + i * dim, RowPtr(row), dim * sizeof(float));
        } else {
          pending[i] = 2;
          local = true;
        }
      }
      if (local) {
        std::lock_guard<std::mutex> g(flag_mu);
        any_pending = true;
      }
    });
  }
  if (!any_pending) return;

  std::unique_lock<std::shared_mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) {
    if (pending[i] == 0) continue;
    int64_t e = FindEntry(ids[i]);
    if (pending[i] == 1) {
      if (e == kEmpty) e = InsertEntry(ids[i]);
      entry_freq_[e] += counts ? counts[i] : 1;
      entry_last_[e] = step;
    }
    if (entry_row_[e] < 0 && entry_freq_[e] >= config_.admit_after) {
      entry_row_[e] = AllocateRow(ids[i]);
    }
    float* out = values + i * dim;
    if (entry_row_[e] >= 0) {
      std::memcpy(out, RowPtr(entry_row_[e]), dim * sizeof(float));
    } else {
      std::fill(out, out + dim, config_.default_value);
    }
  }
}

void HashTable::Lookup(const int64_t* ids, int64_t n, float* values, bool* found,
                       const ParallelFor& pfor) const {
  const int64_t dim = config_.dim;
  std::shared_lock<std::shared_mutex> lock(mu_);
  pfor(n, 50 + 2 * dim, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t e = FindEntry(ids[i]);
      const int64_t row = e == kEmpty ? -1 : entry_row_[e];
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

  // Fold duplicated ids: one target row per distinct id, gradients summed.
  std::vector<int64_t> target_row;
  std::vector<const float*> target_grad;
  target_row.reserve(n);
  target_grad.reserve(n);
  std::vector<float> folded;                 // summed gradients of duplicated ids
  std::vector<int64_t> folded_of_target;     // target -> offset in folded, or -1
  {
    // Rows are dense small integers: a per-row stamp array detects duplicates in O(n).
    std::vector<int64_t> stamp(rows_allocated_, -1);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = FindEntry(ids[i]);
      if (e == kEmpty) continue;
      const int64_t row = entry_row_[e];
      if (row < 0) continue;
      const int64_t t = stamp[row];
      if (t < 0) {
        stamp[row] = static_cast<int64_t>(target_row.size());
        target_row.push_back(row);
        target_grad.push_back(grads + i * dim);
        continue;
      }
      if (folded_of_target.empty()) folded_of_target.assign(n, -1);
      if (folded_of_target[t] < 0) {
        folded_of_target[t] = static_cast<int64_t>(folded.size());
        folded.insert(folded.end(), target_grad[t], target_grad[t] + dim);
      }
      float* acc = folded.data() + folded_of_target[t];
      const float* g = grads + i * dim;
      for (int64_t j = 0; j < dim; ++j) acc[j] += g[j];
    }
    for (size_t t = 0; t < folded_of_target.size() && t < target_row.size(); ++t) {
      if (folded_of_target[t] >= 0) target_grad[t] = folded.data() + folded_of_target[t];
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
  std::vector<int64_t> live;  // entries
  live.reserve(num_entries_);
  for (const Slot& s : slots_) {
    if (s.entry != kEmpty) live.push_back(s.entry);
  }
  std::vector<int64_t> doomed;
  if (max_age >= 0) {
    const int64_t oldest_kept = step - max_age;
    auto keep_end = std::partition(live.begin(), live.end(), [&](int64_t e) {
      return entry_last_[e] >= oldest_kept;
    });
    doomed.assign(keep_end, live.end());
    live.erase(keep_end, live.end());
  }
  if (max_size >= 0 && static_cast<int64_t>(live.size()) > max_size) {
    // Least recently seen first; ties broken by id so every rank agrees.
    const auto older = [&](int64_t a, int64_t b) {
      if (entry_last_[a] != entry_last_[b]) return entry_last_[a] < entry_last_[b];
      return entry_key_[a] < entry_key_[b];
    };
    const int64_t excess = static_cast<int64_t>(live.size()) - max_size;
    std::nth_element(live.begin(), live.begin() + excess, live.end(), older);
    doomed.insert(doomed.end(), live.begin(), live.begin() + excess);
  }
  std::vector<int64_t> evicted;
  evicted.reserve(doomed.size());
  for (int64_t e : doomed) evicted.push_back(entry_key_[e]);
  for (int64_t e : doomed) EraseEntry(e);
  std::sort(evicted.begin(), evicted.end());
  return evicted;
}

ExportedTable HashTable::Export() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const int64_t dim = config_.dim;
  const int64_t sdim = config_.num_slots * dim;
  std::vector<std::pair<int64_t, int64_t>> order;  // (key, entry)
  order.reserve(num_entries_);
  for (const Slot& s : slots_) {
    if (s.entry != kEmpty) order.emplace_back(s.key, s.entry);
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
    const int64_t e = order[i].second;
    out.ids[i] = order[i].first;
    out.freq[i] = entry_freq_[e];
    out.last_seen[i] = entry_last_[e];
    const int64_t row = entry_row_[e];
    out.admitted[i] = row >= 0;
    if (row >= 0) {
      const float* p = RowPtr(row);
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
  slots_.assign(kInitialCapacity, Slot{0, kEmpty});
  num_entries_ = 0;
  entry_key_.clear();
  entry_freq_.clear();
  entry_last_.clear();
  entry_row_.clear();
  free_entries_.clear();
  blocks_.clear();
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
    int64_t e = FindEntry(ids[i]);
    if (e == kEmpty) e = InsertEntry(ids[i]);
    entry_freq_[e] = freq[i];
    entry_last_[e] = last_seen[i];
    if (admitted[i]) {
      if (entry_row_[e] < 0) entry_row_[e] = AllocateRow(ids[i]);
      float* p = RowPtr(entry_row_[e]);
      std::copy(values + i * dim, values + (i + 1) * dim, p);
      std::copy(slots + i * sdim, slots + (i + 1) * sdim, p + dim);
    } else if (entry_row_[e] >= 0) {
      free_rows_.push_back(entry_row_[e]);
      --num_rows_in_use_;
      entry_row_[e] = -1;
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
  const int64_t capacity = NextPow2(std::max<int64_t>(16, 2 * n));
  const uint64_t mask = static_cast<uint64_t>(capacity) - 1;
  // Reused across calls on the same thread: a batch's map costs no page faults.
  thread_local std::vector<int64_t> keys;
  thread_local std::vector<int32_t> slot_of;
  keys.resize(capacity);
  slot_of.assign(capacity, -1);

  out->unique_ids.clear();
  out->counts.clear();
  out->inverse.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    uint64_t h = Mix64(static_cast<uint64_t>(id)) & mask;
    while (true) {
      const int32_t u = slot_of[h];
      if (u < 0) {
        const int32_t nu = static_cast<int32_t>(out->unique_ids.size());
        slot_of[h] = nu;
        keys[h] = id;
        out->unique_ids.push_back(id);
        out->counts.push_back(1);
        out->inverse[i] = nu;
        break;
      }
      if (keys[h] == id) {
        ++out->counts[u];
        out->inverse[i] = u;
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
