#include "mix_cache.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <tuple>

namespace gmeta {
namespace {

int64_t NextPow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

// The fused optimizers, with exactly HashTable::ApplyGradients's arithmetic so a row
// trained in the cache ends bit-identical to one trained in the host table.
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

MixCache::MixCache(const TableConfig& table_config, int64_t capacity, int64_t min_count)
    : table_config_(table_config),
      dim_(table_config.dim),
      num_slots_(table_config.num_slots),
      capacity_(capacity),
      min_count_(min_count) {
  const int64_t index_size = NextPow2(std::max<int64_t>(16, 2 * capacity));
  index_.assign(index_size, IndexEntry{0, kFree});
  mask_ = static_cast<uint64_t>(index_size - 1);
  arena_.assign(capacity * stride(), 0.0f);
  key_.assign(capacity, 0);
  freq_.assign(capacity, 0);
  last_seen_.assign(capacity, 0);
  dirty_.assign(capacity, 0);
  apply_mark_.assign(capacity, 0);
  free_slots_.resize(capacity);
  // Slot 0 is handed out first: the arena fills from its start.
  std::iota(free_slots_.rbegin(), free_slots_.rend(), 0);
  stats_.capacity = capacity;
}

int32_t MixCache::Find(int64_t key) const {
  for (uint64_t i = Home(key);; i = (i + 1) & mask_) {
    const IndexEntry& e = index_[i];
    if (e.slot == kFree) return kFree;
    if (e.key == key) return e.slot;
  }
}

int32_t MixCache::Insert(int64_t key) {
  const int32_t slot = free_slots_.back();
  free_slots_.pop_back();
  uint64_t i = Home(key);
  while (index_[i].slot != kFree) i = (i + 1) & mask_;
  index_[i] = IndexEntry{key, slot};
  key_[slot] = key;
  return slot;
}

void MixCache::Erase(int64_t key) {
  uint64_t i = Home(key);
  while (index_[i].slot != kFree && index_[i].key != key) i = (i + 1) & mask_;
  if (index_[i].slot == kFree) return;
  free_slots_.push_back(index_[i].slot);
  dirty_[index_[i].slot] = 0;
  // Backward-shift deletion, as in HashTable::EraseSlot.
  uint64_t j = i;
  while (true) {
    j = (j + 1) & mask_;
    if (index_[j].slot == kFree) break;
    const uint64_t k = Home(index_[j].key);
    const bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
    if (!stays) {
      index_[i] = index_[j];
      i = j;
    }
  }
  index_[i].slot = kFree;
}

void MixCache::WriteBack(HashTable& table, const std::vector<int32_t>& slots) {
  const int64_t n = static_cast<int64_t>(slots.size());
  if (n == 0) return;
  const int64_t sdim = num_slots_ * dim_;
  std::vector<int64_t> ids(n), freq(n), last_seen(n);
  std::vector<float> values(n * dim_), slot_values(n * sdim);
  std::vector<uint8_t> admitted(n, 1);
  for (int64_t k = 0; k < n; ++k) {
    const int32_t s = slots[k];
    ids[k] = key_[s];
    freq[k] = freq_[s];
    last_seen[k] = last_seen_[s];
    const float* row = Row(s);
    std::copy(row, row + dim_, values.begin() + k * dim_);
    std::copy(row + dim_, row + dim_ + sdim, slot_values.begin() + k * sdim);
    dirty_[s] = 0;
  }
  table.Import(ids.data(), values.data(), slot_values.data(), freq.data(), last_seen.data(),
               admitted.data(), n, /*clear_first=*/false, /*shard_index=*/0, /*num_shards=*/1);
  stats_.written_back += n;
}

std::vector<int32_t> MixCache::ReadIn(const HashTable& table, const std::vector<int64_t>& ids,
                                     const ParallelFor& pfor) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int32_t> slot_of(n, kFree);
  if (n == 0) return slot_of;
  const int64_t sdim = num_slots_ * dim_;
  std::vector<float> values(n * dim_), slots(n * sdim);
  std::vector<int64_t> freq(n), last_seen(n);
  std::unique_ptr<bool[]> found(new bool[n]);
  table.ReadEntries(ids.data(), n, values.data(), slots.data(), freq.data(), last_seen.data(),
                    found.get(), pfor);
  for (int64_t i = 0; i < n; ++i) {
    if (!found[i]) continue;  // no row to cache (imported as not admitted)
    const int32_t s = Insert(ids[i]);
    slot_of[i] = s;
    freq_[s] = freq[i];
    last_seen_[s] = last_seen[i];
    dirty_[s] = 0;
  }
  pfor(n, 2 * stride(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (slot_of[i] == kFree) continue;
      float* row = Row(slot_of[i]);
      std::memcpy(row, values.data() + i * dim_, dim_ * sizeof(float));
      std::memcpy(row + dim_, slots.data() + i * sdim, sdim * sizeof(float));
    }
  });
  return slot_of;
}

void MixCache::Admit(HashTable& table, const int64_t* ids, const int64_t* counts,
                     const int64_t* freq, int64_t n, const ParallelFor& pfor) {
  // Only ids with a row can be cached: after a lookup, those whose frequency reached
  // admit_after. When the cache is full a candidate must beat its coldest entry.
  int64_t bar = std::max<int64_t>({min_count_, table_config_.admit_after, 1});
  if (free_slots_.empty()) {
    bar = std::max(bar, *std::min_element(freq_.begin(), freq_.end()) + 1);
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
  if (static_cast<int64_t>(merged.size()) > capacity_) {
    std::nth_element(merged.begin(), merged.begin() + capacity_, merged.end(), hotter);
    merged.resize(capacity_);
  }
  std::sort(merged.begin(), merged.end(), hotter);

  // Free slots first, then replace the coldest cached entries (LFU; ties: least recently
  // seen, then lowest id) while the candidate is strictly more frequent.
  const int64_t num_candidates = static_cast<int64_t>(merged.size());
  int64_t admit = std::min<int64_t>(free_slots_.size(), num_candidates);
  int64_t replaced = 0;
  std::vector<std::tuple<int64_t, int64_t, int64_t>> victims;  // (freq, last_seen, key)
  if (admit < num_candidates) {
    const int64_t hottest_left = merged[admit].freq;  // no victim at or above it can go
    for (const IndexEntry& e : index_) {
      if (e.slot != kFree && freq_[e.slot] < hottest_left) {
        victims.emplace_back(freq_[e.slot], last_seen_[e.slot], e.key);
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
      const int32_t s = Find(std::get<2>(victims[k]));
      if (dirty_[s]) dirty_victims.push_back(s);
    }
    WriteBack(table, dirty_victims);
    for (int64_t k = 0; k < replaced; ++k) Erase(std::get<2>(victims[k]));
    stats_.evicted += replaced;
  }
  std::vector<int64_t> admit_ids(admit);
  for (int64_t k = 0; k < admit; ++k) admit_ids[k] = merged[k].id;
  // The lookup just brought the host table's entries up to date: the cached copies start
  // identical (clean).
  const std::vector<int32_t> slot_of = ReadIn(table, admit_ids, pfor);
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
    if (slot_of[k] == kFree) continue;
    ++entered;
    uint64_t i = set_home(admit_ids[k]);
    while (set_used[i]) i = (i + 1) & set_mask;
    set_used[i] = 1;
    set_key[i] = admit_ids[k];
  }
  stats_.admitted += entered;
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
  stats_.hits += occurrences.load() - entered;
}

std::vector<int32_t> MixCache::FindAll(const int64_t* ids, int64_t n,
                                      const ParallelFor& pfor) const {
  std::vector<int32_t> slot_of(n);
  pfor(n, 20, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + 8 < end) __builtin_prefetch(&index_[Home(ids[i + 8])]);
      slot_of[i] = Find(ids[i]);
    }
  });
  return slot_of;
}

void MixCache::LookupOrInsert(HashTable& table, const int64_t* ids, const int64_t* counts,
                              int64_t n, int64_t step, float* values, const ParallelFor& pfor) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::vector<int32_t> slot_of = FindAll(ids, n, pfor);
  std::vector<int64_t> miss;
  for (int64_t i = 0; i < n; ++i) {  // bookkeeping only: serial, touches hits alone
    const int64_t c = counts ? counts[i] : 1;
    stats_.lookups += c;
    const int32_t s = slot_of[i];
    if (s == kFree) {
      miss.push_back(i);
      continue;
    }
    freq_[s] += c;
    last_seen_[s] = step;
    dirty_[s] = 1;
    stats_.hits += c;
    ++stats_.unique_hits;
  }
  stats_.unique_lookups += n;
  pfor(n, 2 * dim_, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (slot_of[i] != kFree) std::memcpy(values + i * dim_, Row(slot_of[i]), dim_ * sizeof(float));
    }
  });
  if (miss.empty()) return;

  const int64_t m = static_cast<int64_t>(miss.size());
  std::vector<int64_t> miss_ids(m), miss_counts(counts ? m : 0), miss_freq(m);
  pfor(m, 4, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      miss_ids[k] = ids[miss[k]];
      if (counts) miss_counts[k] = counts[miss[k]];
    }
  });
  std::vector<float> miss_values(m * dim_);
  table.LookupOrInsert(miss_ids.data(), counts ? miss_counts.data() : nullptr, m, step,
                       miss_values.data(), pfor, miss_freq.data());
  pfor(m, 2 * dim_, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      std::memcpy(values + miss[k] * dim_, miss_values.data() + k * dim_, dim_ * sizeof(float));
    }
  });
  if (capacity_ > 0) {
    Admit(table, miss_ids.data(), counts ? miss_counts.data() : nullptr, miss_freq.data(), m,
          pfor);
  }
}

void MixCache::Lookup(const HashTable& table, const int64_t* ids, int64_t n, float* values,
                      bool* found, const ParallelFor& pfor) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> miss;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = Find(ids[i]);
    if (s == kFree) {
      miss.push_back(i);
      continue;
    }
    std::memcpy(values + i * dim_, Row(s), dim_ * sizeof(float));
    if (found) found[i] = true;
  }
  if (miss.empty()) return;
  const int64_t m = static_cast<int64_t>(miss.size());
  std::vector<int64_t> miss_ids(m);
  for (int64_t k = 0; k < m; ++k) miss_ids[k] = ids[miss[k]];
  std::vector<float> miss_values(m * dim_);
  std::unique_ptr<bool[]> miss_found(new bool[m]);
  table.Lookup(miss_ids.data(), m, miss_values.data(), miss_found.get(), pfor);
  for (int64_t k = 0; k < m; ++k) {
    std::memcpy(values + miss[k] * dim_, miss_values.data() + k * dim_, dim_ * sizeof(float));
    if (found) found[miss[k]] = miss_found[k];
  }
}

int64_t MixCache::ApplyGradients(HashTable& table, const int64_t* ids, const float* grads,
                                 int64_t n, const OptimizerParams& params,
                                 const ParallelFor& pfor) {
  std::lock_guard<std::mutex> lock(mu_);
  if (++apply_epoch_ == (uint64_t{1} << 32)) {
    std::fill(apply_mark_.begin(), apply_mark_.end(), 0);
    apply_epoch_ = 1;
  }
  const std::vector<int32_t> slot_of = FindAll(ids, n, pfor);
  std::vector<int64_t> rest;  // positions of ids not cached
  std::vector<int32_t> target_slot;
  std::vector<const float*> target_grad;
  std::vector<std::pair<int64_t, int64_t>> duplicates;  // (target, position)
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = slot_of[i];
    if (s == kFree) {
      rest.push_back(i);
      continue;
    }
    const uint64_t mark = apply_mark_[s];
    if ((mark >> 32) == apply_epoch_) {
      duplicates.emplace_back(static_cast<int64_t>(mark & 0xFFFFFFFFULL), i);
      continue;
    }
    apply_mark_[s] = (apply_epoch_ << 32) | static_cast<uint64_t>(target_slot.size());
    target_slot.push_back(s);
    target_grad.push_back(grads + i * dim_);
  }
  // Duplicates summed in order of appearance, first occurrence first: HashTable's order.
  std::vector<float> folded;
  if (!duplicates.empty()) {
    std::vector<int64_t> folded_at(target_slot.size(), -1);
    for (const auto& [t, i] : duplicates) {
      if (folded_at[t] >= 0) continue;
      folded_at[t] = static_cast<int64_t>(folded.size());
      folded.insert(folded.end(), target_grad[t], target_grad[t] + dim_);
    }
    for (const auto& [t, i] : duplicates) {
      float* acc = folded.data() + folded_at[t];
      const float* g = grads + i * dim_;
      for (int64_t j = 0; j < dim_; ++j) acc[j] += g[j];
    }
    for (size_t t = 0; t < target_slot.size(); ++t) {
      if (folded_at[t] >= 0) target_grad[t] = folded.data() + folded_at[t];
    }
  }
  const float alpha = params.kind == Optimizer::kAdam ? AdamAlpha(params) : 0.0f;
  pfor(static_cast<int64_t>(target_slot.size()), 12 * dim_, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      ApplyOne(params, dim_, alpha, Row(target_slot[t]), target_grad[t]);
      dirty_[target_slot[t]] = 1;
    }
  });
  int64_t updated = static_cast<int64_t>(target_slot.size());
  if (!rest.empty()) {
    const int64_t r = static_cast<int64_t>(rest.size());
    std::vector<int64_t> rest_ids(r);
    std::vector<float> rest_grads(r * dim_);
    pfor(r, 2 * dim_, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        rest_ids[k] = ids[rest[k]];
        std::memcpy(rest_grads.data() + k * dim_, grads + rest[k] * dim_, dim_ * sizeof(float));
      }
    });
    updated += table.ApplyGradients(rest_ids.data(), rest_grads.data(), r, params, pfor);
  }
  return updated;
}

void MixCache::FlushLocked(HashTable& table) {
  std::vector<int32_t> dirty;
  for (const IndexEntry& e : index_) {
    if (e.slot != kFree && dirty_[e.slot]) dirty.push_back(e.slot);
  }
  WriteBack(table, dirty);
}

int64_t MixCache::Flush(HashTable& table) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t before = stats_.written_back;
  FlushLocked(table);
  return stats_.written_back - before;
}

void MixCache::Drop(const int64_t* ids, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) Erase(ids[i]);
}

int64_t MixCache::Rebalance(HashTable& table, const ParallelFor& pfor) {
  std::lock_guard<std::mutex> lock(mu_);
  FlushLocked(table);  // the host table's frequencies are now the exact ones
  const std::vector<int64_t> top = table.MostFrequent(capacity_);
  std::vector<uint8_t> keep(capacity_, 0);
  std::vector<int64_t> read_in;
  for (int64_t id : top) {
    const int32_t s = Find(id);
    if (s == kFree) {
      read_in.push_back(id);
    } else {
      keep[s] = 1;
    }
  }
  std::vector<int64_t> dropped;
  for (const IndexEntry& e : index_) {
    if (e.slot != kFree && !keep[e.slot]) dropped.push_back(e.key);
  }
  for (int64_t key : dropped) Erase(key);  // clean after the flush: nothing to write
  stats_.evicted += static_cast<int64_t>(dropped.size());
  const std::vector<int32_t> slot_of = ReadIn(table, read_in, pfor);
  stats_.admitted +=
      std::count_if(slot_of.begin(), slot_of.end(), [](int32_t s) { return s != kFree; });
  return capacity_ - static_cast<int64_t>(free_slots_.size());
}

void MixCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(index_.begin(), index_.end(), IndexEntry{0, kFree});
  std::fill(dirty_.begin(), dirty_.end(), 0);
  free_slots_.resize(capacity_);
  std::iota(free_slots_.rbegin(), free_slots_.rend(), 0);
}

MixCacheStats MixCache::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  MixCacheStats s = stats_;
  s.size = capacity_ - static_cast<int64_t>(free_slots_.size());
  return s;
}

std::vector<int64_t> MixCache::CachedIds() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> ids;
  for (const IndexEntry& e : index_) {
    if (e.slot != kFree) ids.push_back(e.key);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace gmeta
