// Virtual Sparse Id's dedup (hash_table.h: Dedup), in parallel.
//
// The ids are first spread over up to 256 buckets by the top bits of their hash (a stable
// counting sort of positions, chunk by chunk), so each bucket is deduplicated alone, by
// one thread, with a map small enough to stay in the CPU's caches. The unique ids are
// then numbered in order of first appearance, exactly as a single pass over the batch
// would number them: a unique id's number is how many first appearances precede it.
//
// Its per-call arrays (about 25 bytes per id) are kept between calls in a small pool, so a
// steady stream of batches does not map, fault in and zero fresh memory on every call, and
// the outputs are written once, straight into the memory the caller provides.
#include <algorithm>
#include <cstring>
#include <mutex>

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


// The arrays of one call, kept for the next. Every element a call reads it has written
// first, so nothing is cleared between calls.
struct DedupScratch {
  std::vector<int64_t> chunk_offset, bucket_begin, bucket_unique, chunk_firsts;
  std::vector<int32_t> by_bucket, local_index, first_pos, number_at;
  std::vector<int64_t> bucket_ids, first_count;
  std::vector<uint8_t> is_first;
  // num_partitions > 1: the outputs before they are grouped by owner.
  std::vector<int64_t> unique_ids, counts, owner;
  std::vector<int32_t> new_pos;
};

// Scratch arrays of the calls in flight (usually one): taken for a call, given back after.
class ScratchPool {
 public:
  std::unique_ptr<DedupScratch> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) return std::make_unique<DedupScratch>();
    std::unique_ptr<DedupScratch> s = std::move(free_.back());
    free_.pop_back();
    return s;
  }
  void Give(std::unique_ptr<DedupScratch> s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(s));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<DedupScratch>> free_;
};

ScratchPool& Pool() {
  static ScratchPool* pool = new ScratchPool();  // never destroyed: outlives every call
  return *pool;
}

void DedupWith(DedupScratch& s, const int64_t* ids, int64_t n, int64_t num_partitions,
               const DedupAllocate& allocate, const ParallelFor& pfor) {
  int bits = 0;
  while (bits < 8 && (n >> (bits + 12)) > 0) ++bits;  // ~4k ids or more per bucket
  const int64_t buckets = int64_t{1} << bits;
  const auto bucket_of = [bits](uint64_t h) {
    return bits ? static_cast<int64_t>(h >> (64 - bits)) : int64_t{0};
  };
  const int64_t chunks = ParallelChunks(n);
  const auto chunk_begin = [n, chunks](int64_t c) { return n * c / chunks; };

  // 1. Positions grouped by bucket, in order within each bucket. The ids are copied beside
  //    their positions so each bucket is then read sequentially.
  int64_t* bucket_begin = Sized(s.bucket_begin, buckets + 1);
  int32_t* by_bucket = Sized(s.by_bucket, n);
  int64_t* bucket_ids = Sized(s.bucket_ids, n);
  StableBucketSort(
      n, buckets, [&](int64_t i) { return bucket_of(Mix64(static_cast<uint64_t>(ids[i]))); },
      [&](int64_t i, int64_t at) {
        by_bucket[at] = static_cast<int32_t>(i);
        bucket_ids[at] = ids[i];
      },
      bucket_begin, &s.chunk_offset, pfor);

  // 2. Each bucket alone: its unique ids (first position and count, stored from the
  //    bucket's own start), each position's local unique index, and whether it is a first.
  int32_t* local_index = Sized(s.local_index, n);
  int32_t* first_pos = Sized(s.first_pos, n);
  int64_t* first_count = Sized(s.first_count, n);
  int64_t* bucket_unique = Sized(s.bucket_unique, buckets);
  uint8_t* is_first = Sized(s.is_first, n);
  pfor(buckets, (n / buckets + 1) * 60, [&](int64_t first, int64_t last) {
    thread_local LocalMap map;
    for (int64_t b = first; b < last; ++b) {
      const int64_t lo = bucket_begin[b], hi = bucket_begin[b + 1];
      map.Reset(hi - lo);
      int32_t* firsts = first_pos + lo;
      int64_t* counts = first_count + lo;
      int32_t num_unique = 0;
      for (int64_t k = lo; k < hi; ++k) {
        const int32_t i = by_bucket[k];
        const int64_t id = bucket_ids[k];
        uint64_t h = Mix64(static_cast<uint64_t>(id)) & map.mask;
        while (true) {
          DedupSlot& slot = map.slots[h];
          if (slot.epoch != map.epoch) {
            const int32_t u = num_unique++;
            slot = DedupSlot{id, map.epoch, u};
            firsts[u] = i;
            counts[u] = 1;
            is_first[i] = 1;
            local_index[k] = u;
            break;
          }
          if (slot.key == id) {
            ++counts[slot.index];
            is_first[i] = 0;
            local_index[k] = slot.index;
            break;
          }
          h = (h + 1) & map.mask;
        }
      }
      bucket_unique[b] = num_unique;
    }
  });

  // 3. Number the unique ids in order of first appearance: a prefix sum of is_first.
  int64_t* chunk_firsts = Sized(s.chunk_firsts, chunks + 1);
  chunk_firsts[0] = 0;
  pfor(chunks, (n / chunks + 1) * 2, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      int64_t count = 0;
      for (int64_t i = chunk_begin(c); i < chunk_begin(c + 1); ++i) count += is_first[i];
      chunk_firsts[c + 1] = count;
    }
  });
  for (int64_t c = 0; c < chunks; ++c) chunk_firsts[c + 1] += chunk_firsts[c];
  const int64_t u = chunk_firsts[chunks];
  int32_t* number_at = Sized(s.number_at, n);  // meaningful at first positions only
  pfor(chunks, (n / chunks + 1) * 2, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      int32_t next = static_cast<int32_t>(chunk_firsts[c]);
      for (int64_t i = chunk_begin(c); i < chunk_begin(c + 1); ++i) {
        if (is_first[i]) number_at[i] = next++;
      }
    }
  });

  // 4. Outputs, bucket by bucket: straight into the caller's memory with one partition,
  //    else into scratch, to be grouped by owner below.
  const int64_t parts = std::max<int64_t>(1, num_partitions);
  const DedupOutputs out = allocate(u);
  if (out.splits == nullptr) return;  // the caller could not allocate; it says why
  int64_t* unique_ids = parts == 1 ? out.unique_ids : Sized(s.unique_ids, u);
  int64_t* counts = parts == 1 ? out.counts : Sized(s.counts, u);
  pfor(buckets, (n / buckets + 1) * 10, [&](int64_t first, int64_t last) {
    std::vector<int32_t> number;
    for (int64_t b = first; b < last; ++b) {
      const int64_t lo = bucket_begin[b];
      number.resize(bucket_unique[b]);
      for (int64_t k = 0; k < bucket_unique[b]; ++k) {
        const int32_t g = number_at[first_pos[lo + k]];
        number[k] = g;
        unique_ids[g] = ids[first_pos[lo + k]];  // one read per unique id
        counts[g] = first_count[lo + k];
      }
      for (int64_t k = lo; k < bucket_begin[b + 1]; ++k) {
        out.inverse[by_bucket[k]] = number[local_index[k]];
      }
    }
  });

  if (parts == 1) {
    out.splits[0] = static_cast<int32_t>(u);
    return;
  }
  // Stable counting sort of the unique ids by owner.
  int64_t* owner = Sized(s.owner, u);
  std::vector<int64_t> offset(parts, 0);
  for (int64_t k = 0; k < u; ++k) {
    owner[k] = OwnerOf(unique_ids[k], parts);
    ++offset[owner[k]];
  }
  for (int64_t p = 0; p < parts; ++p) out.splits[p] = static_cast<int32_t>(offset[p]);
  int64_t at = 0;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t size = offset[p];
    offset[p] = at;
    at += size;
  }
  int32_t* new_pos = Sized(s.new_pos, u);
  for (int64_t k = 0; k < u; ++k) {
    const int64_t pos = offset[owner[k]]++;
    new_pos[k] = static_cast<int32_t>(pos);
    out.unique_ids[pos] = unique_ids[k];
    out.counts[pos] = counts[k];
  }
  pfor(n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out.inverse[i] = new_pos[out.inverse[i]];
  });
}

}  // namespace

void Dedup(const int64_t* ids, int64_t n, int64_t num_partitions,
           const DedupAllocate& allocate, const ParallelFor& pfor) {
  std::unique_ptr<DedupScratch> scratch = Pool().Take();
  DedupWith(*scratch, ids, n, num_partitions, allocate, pfor);
  Pool().Give(std::move(scratch));
}

}  // namespace gmeta
