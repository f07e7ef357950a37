// Virtual Sparse Id's dedup (hash_table.h: Dedup), in parallel.
//
// The ids are first spread over up to 256 buckets by the top bits of their hash (a stable
// counting sort of positions, chunk by chunk), so each bucket is deduplicated alone, by
// one thread, with a map small enough to stay in the CPU's caches. The unique ids are
// then numbered in order of first appearance, exactly as a single pass over the batch
// would number them: a unique id's number is how many first appearances precede it.
#include <algorithm>
#include <cstring>

#include "hash_table.h"
#include "hash_table_internal.h"

namespace gmeta {
namespace {

struct DedupSlot {
  int64_t key;
  uint32_t epoch;
  int32_t index;
};

// A thread-local map reused across buckets and calls: a slot is live when its epoch is
// the current one, so nothing needs clearing between uses.
struct LocalMap {
  std::vector<DedupSlot> slots;
  uint32_t epoch = 0;
  uint64_t mask = 0;
  void Reset(int64_t n) {
    const int64_t capacity = NextPow2(std::max<int64_t>(16, 2 * n));
    if (static_cast<int64_t>(slots.size()) < capacity || ++epoch == 0) {
      slots.assign(std::max<int64_t>(capacity, static_cast<int64_t>(slots.size())),
                   DedupSlot{0, 0, 0});
      epoch = 1;
    }
    mask = static_cast<uint64_t>(capacity - 1);  // a prefix of slots is enough
  }
};

}  // namespace

void Dedup(const int64_t* ids, int64_t n, int64_t num_partitions, DedupResult* out,
           const ParallelFor& pfor) {
  int bits = 0;
  while (bits < 8 && (n >> (bits + 12)) > 0) ++bits;  // ~4k ids or more per bucket
  const int64_t buckets = int64_t{1} << bits;
  const auto bucket_of = [bits](uint64_t h) {
    return bits ? static_cast<int64_t>(h >> (64 - bits)) : int64_t{0};
  };
  const int64_t chunks = std::min<int64_t>(64, std::max<int64_t>(1, n >> 14));
  const auto chunk_begin = [n, chunks](int64_t c) { return n * c / chunks; };

  // 1. Positions grouped by bucket, in order within each bucket.
  std::vector<int64_t> hist(chunks * buckets, 0);
  pfor(chunks, (n / chunks + 1) * 10, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      int64_t* h = hist.data() + c * buckets;
      for (int64_t i = chunk_begin(c); i < chunk_begin(c + 1); ++i) {
        ++h[bucket_of(Mix64(static_cast<uint64_t>(ids[i])))];
      }
    }
  });
  std::vector<int64_t> bucket_begin(buckets + 1, 0);
  {
    int64_t at = 0;
    for (int64_t b = 0; b < buckets; ++b) {
      bucket_begin[b] = at;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t count = hist[c * buckets + b];
        hist[c * buckets + b] = at;  // becomes the chunk's write offset in the bucket
        at += count;
      }
    }
    bucket_begin[buckets] = at;
  }
  // The ids are copied beside their positions so each bucket is then read sequentially.
  std::vector<int32_t> by_bucket(n);
  std::vector<int64_t> bucket_ids(n);
  pfor(chunks, (n / chunks + 1) * 10, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      int64_t* offset = hist.data() + c * buckets;
      for (int64_t i = chunk_begin(c); i < chunk_begin(c + 1); ++i) {
        const int64_t at = offset[bucket_of(Mix64(static_cast<uint64_t>(ids[i])))]++;
        by_bucket[at] = static_cast<int32_t>(i);
        bucket_ids[at] = ids[i];
      }
    }
  });

  // 2. Each bucket alone: its unique ids (first position, count), each position's local
  //    unique index.
  std::vector<int32_t> local_index(n);
  std::vector<std::vector<int32_t>> first_pos(buckets);
  std::vector<std::vector<int64_t>> bucket_counts(buckets);
  std::vector<uint8_t> is_first(n, 0);
  pfor(buckets, (n / buckets + 1) * 60, [&](int64_t first, int64_t last) {
    thread_local LocalMap map;
    for (int64_t b = first; b < last; ++b) {
      const int64_t lo = bucket_begin[b], hi = bucket_begin[b + 1];
      map.Reset(hi - lo);
      std::vector<int32_t>& firsts = first_pos[b];
      std::vector<int64_t>& counts = bucket_counts[b];
      for (int64_t k = lo; k < hi; ++k) {
        const int32_t i = by_bucket[k];
        const int64_t id = bucket_ids[k];
        uint64_t h = Mix64(static_cast<uint64_t>(id)) & map.mask;
        while (true) {
          DedupSlot& slot = map.slots[h];
          if (slot.epoch != map.epoch) {
            const int32_t u = static_cast<int32_t>(firsts.size());
            slot = DedupSlot{id, map.epoch, u};
            firsts.push_back(i);
            counts.push_back(1);
            is_first[i] = 1;
            local_index[k] = u;
            break;
          }
          if (slot.key == id) {
            ++counts[slot.index];
            local_index[k] = slot.index;
            break;
          }
          h = (h + 1) & map.mask;
        }
      }
    }
  });

  // 3. Number the unique ids in order of first appearance: a prefix sum of is_first.
  std::vector<int64_t> chunk_firsts(chunks + 1, 0);
  pfor(chunks, (n / chunks + 1) * 2, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      int64_t count = 0;
      for (int64_t i = chunk_begin(c); i < chunk_begin(c + 1); ++i) count += is_first[i];
      chunk_firsts[c + 1] = count;
    }
  });
  for (int64_t c = 0; c < chunks; ++c) chunk_firsts[c + 1] += chunk_firsts[c];
  const int64_t u = chunk_firsts[chunks];
  std::vector<int32_t> number_at(n);  // meaningful at first positions only
  pfor(chunks, (n / chunks + 1) * 2, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      int32_t next = static_cast<int32_t>(chunk_firsts[c]);
      for (int64_t i = chunk_begin(c); i < chunk_begin(c + 1); ++i) {
        if (is_first[i]) number_at[i] = next++;
      }
    }
  });

  // 4. Outputs, bucket by bucket.
  out->unique_ids.resize(u);
  out->counts.resize(u);
  out->inverse.resize(n);
  pfor(buckets, (n / buckets + 1) * 10, [&](int64_t first, int64_t last) {
    std::vector<int32_t> number;
    for (int64_t b = first; b < last; ++b) {
      const std::vector<int32_t>& firsts = first_pos[b];
      number.resize(firsts.size());
      for (size_t k = 0; k < firsts.size(); ++k) {
        const int32_t g = number_at[firsts[k]];
        number[k] = g;
        out->unique_ids[g] = ids[firsts[k]];  // one read per unique id
        out->counts[g] = bucket_counts[b][k];
      }
      for (int64_t k = bucket_begin[b]; k < bucket_begin[b + 1]; ++k) {
        out->inverse[by_bucket[k]] = number[local_index[k]];
      }
    }
  });

  const int64_t parts = std::max<int64_t>(1, num_partitions);
  out->splits.assign(parts, 0);
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
  pfor(n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out->inverse[i] = new_pos[out->inverse[i]];
  });
}

}  // namespace gmeta
