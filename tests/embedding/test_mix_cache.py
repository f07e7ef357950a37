"""MixCache against the plain table: same rows, slots and counters after any sequence of
lookups, updates, rebalances, evictions, exports and imports; the admission rule and the
rebalance against plain-Python references; hit counting; bad input."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.embedding import table_ops
from gmeta_tf.embedding import (
    SGD,
    Adagrad,
    Adam,
    FeatureConfig,
    HashTable,
    MixCacheConfig,
    ShardedHashEmbedding,
    TableConfig,
)

OPTIMIZERS = {"sgd": SGD(0.1), "adagrad": Adagrad(0.1), "adam": Adam(0.01)}


def _assert_same_export(a, b):
    for field, x, y in zip(table_ops.TableSnapshot._fields, a.export(), b.export()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=field)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_cached_table_trains_exactly_like_the_plain_table(optimizer):
    rng = np.random.default_rng(0)
    opt = OPTIMIZERS[optimizer]
    plain = HashTable(4, optimizer=opt)
    cached = HashTable(4, cache=MixCacheConfig(capacity=12, min_count=2), optimizer=opt)
    for step in range(1, 41):
        raw = rng.zipf(1.2, 300) % 400
        ids, counts = np.unique(raw, return_counts=True)
        perm = rng.permutation(ids.size)
        # Duplicated ids, as when two requesters ask an owner for the same id (the second
        # asking once: too rare alone to be admitted, still part of the id's frequency).
        ids = np.concatenate([ids[perm], ids[perm][:7]])
        counts = np.concatenate([counts[perm], np.ones(7, np.int64)])
        if step % 8 == 0:  # a new id hotter than anything cached: LFU replaces the coldest
            ids, counts = np.append(ids, 10_000 + step), np.append(counts, 10_000)
        rows = [t.lookup_or_insert(ids, step=step, counts=counts).numpy() for t in (plain, cached)]
        np.testing.assert_array_equal(rows[1], rows[0], err_msg=f"step {step}")
        grads = tf.constant(rng.normal(size=(ids.size, 4)).astype(np.float32))
        updated = [int(t.apply_gradients(ids, grads, step=step)) for t in (plain, cached)]
        assert updated[0] == updated[1]
        if step == 20:
            assert cached.rebalance() == 12
        if step == 30:  # eviction must judge cached ids by their current last-seen step
            evicted = [t.evict(step, max_age=3).numpy() for t in (plain, cached)]
            np.testing.assert_array_equal(evicted[1], evicted[0])
            assert evicted[0].size > 0
    np.testing.assert_array_equal(cached.lookup(np.arange(-5, 405)).numpy(),
                                  plain.lookup(np.arange(-5, 405)).numpy())
    _assert_same_export(plain, cached)
    stats = cached.cache_stats()
    assert stats["size"] == 12 and stats["hits"] > 0.3 * stats["lookups"]
    assert stats["evicted"] > 0 and stats["written_back"] > 0  # LFU replacement happened


def test_hit_counting_admission_and_lfu_replacement():
    plain = HashTable(2, optimizer=SGD(0.5))
    cached = HashTable(2, cache=MixCacheConfig(capacity=2, min_count=2), optimizer=SGD(0.5))

    def both(ids, counts, step):
        for t in (plain, cached):
            t.lookup_or_insert(np.array(ids), step=step, counts=np.array(counts))

    both([1, 2, 3], [5, 1, 3], 1)  # 1 and 3 are frequent: admitted, first occurrence missed
    s = cached.cache_stats()
    assert (s["lookups"], s["hits"], s["admitted"], s["unique_hits"]) == (9, 6, 2, 0)
    np.testing.assert_array_equal(cached.cached_ids(), [1, 3])
    both([1, 3, 2], [1, 1, 1], 2)  # two cached ids hit; 2 is too rare to enter
    assert cached.cache_stats()["hits"] == 8
    for t in (plain, cached):
        t.apply_gradients(np.array([1, 2]), tf.ones([2, 2]))
    both([4], [10], 3)  # full: 4 (10) replaces the least frequent, 3 (4 uses)
    s = cached.cache_stats()
    assert (s["lookups"], s["hits"], s["evicted"]) == (22, 17, 1)
    np.testing.assert_array_equal(cached.cached_ids(), [1, 4])
    assert s["hit_rate"] == pytest.approx(17 / 22)
    _assert_same_export(plain, cached)  # 3 was written back; 1's update is flushed


def test_import_replaces_cached_rows():
    cached = HashTable(3, cache=MixCacheConfig(capacity=4, min_count=1), optimizer=Adagrad(0.1))
    cached.lookup_or_insert(np.array([7, 8]), step=1, counts=np.array([3, 3]))
    assert cached.cache_stats()["size"] == 2
    other = HashTable(3, optimizer=Adagrad(0.1), seed=5)
    other.lookup_or_insert(np.array([7, 9]))
    cached.import_(other.export())
    assert cached.cache_stats()["size"] == 0
    _assert_same_export(other, cached)
    np.testing.assert_array_equal(cached.lookup(np.array([7, 8, 9])).numpy(),
                                  other.lookup(np.array([7, 8, 9])).numpy())


def test_bad_cache_settings_name_the_value_and_what_is_allowed():
    with pytest.raises(ValueError, match=r"capacity = 0 is not allowed: expected an integer >= 1"):
        MixCacheConfig(capacity=0)
    with pytest.raises(ValueError, match=r"capacity = 1.5 is not allowed: expected an integer"):
        MixCacheConfig(capacity=1.5)
    with pytest.raises(ValueError, match=r"min_count = -1 is not allowed: expected an integer >= 1"):
        MixCacheConfig(capacity=10, min_count=-1)
    with pytest.raises(ValueError,
                       match=r"rebalance_every = -3 is not allowed: expected an integer >= 0"):
        MixCacheConfig(capacity=10, rebalance_every=-3)
    with pytest.raises(ValueError, match=r"capacity = 2147483648 is not allowed: expected an "
                                         r"integer <= 2147483647"):
        MixCacheConfig(capacity=2**31)
    with pytest.raises(ValueError, match=r"caches: 'nope' is not one of the tables \['t'\]"):
        ShardedHashEmbedding([TableConfig("t", 4)], [FeatureConfig("x", "t")],
                             caches={"nope": MixCacheConfig(8)})
    with pytest.raises(TypeError, match=r"caches\['t'\] must be a MixCacheConfig"):
        ShardedHashEmbedding([TableConfig("t", 4)], [FeatureConfig("x", "t")],
                             caches={"t": 100})


class ReferenceCache:
    """The admission rule of ops/hash_table.h (the cache), written plainly: per id the host table's
    frequency and last-seen step, the cached ids' own counters, and the hit counters."""

    def __init__(self, capacity, min_count, admit_after=1):
        self.capacity, self.min_count, self.admit_after = capacity, min_count, admit_after
        self.freq = collections.Counter()  # host table
        self.last = {}
        self.cached = {}  # id -> [freq, last_seen]
        self.hits = self.lookups = self.admitted = self.evicted = 0

    def lookup(self, ids, counts, step):
        call = collections.Counter()
        for k, c in zip(ids.tolist(), counts.tolist()):
            self.lookups += c
            if k in self.cached:
                self.cached[k][0] += c
                self.cached[k][1] = step
                self.hits += c
            else:
                call[k] += c
                self.freq[k] += c
                self.last[k] = step
        bar = max(self.min_count, self.admit_after)
        if len(self.cached) == self.capacity:
            bar = max(bar, min(f for f, _ in self.cached.values()) + 1)
        cands = sorted((k for k in call if self.freq[k] >= bar), key=lambda k: (-self.freq[k], k))
        admit = cands[:self.capacity - len(self.cached)]
        rest = cands[len(admit):]
        victims = sorted(self.cached, key=lambda k: (*self.cached[k], k))
        for cand, victim in zip(rest, victims):
            if self.freq[cand] <= self.cached[victim][0]:
                break
            self.freq[victim], self.last[victim] = self.cached.pop(victim)  # write-back
            self.evicted += 1
            admit.append(cand)
        for k in admit:
            self.cached[k] = [self.freq[k], self.last[k]]
            self.hits += call[k] - 1
        self.admitted += len(admit)


@pytest.mark.parametrize("capacity,min_count,admit_after", [(1, 1, 1), (16, 1, 1), (16, 3, 1),
                                                            (40, 2, 1), (16, 1, 3)])
def test_admission_follows_exact_frequencies_like_the_reference(capacity, min_count, admit_after):
    rng = np.random.default_rng(capacity + 7 * min_count + 31 * admit_after)
    opt = Adagrad(0.1)
    plain = HashTable(3, optimizer=opt, admit_after=admit_after)
    cached = HashTable(3, cache=MixCacheConfig(capacity, min_count), optimizer=opt,
                                admit_after=admit_after)
    ref = ReferenceCache(capacity, min_count, admit_after)
    for step in range(1, 61):
        # Two requesters' unique ids, concatenated as an owner receives them: an id asked
        # by both appears twice, and only the total of its counts may make it a candidate.
        parts = []
        for _ in range(2):
            ids, counts = np.unique(rng.zipf(1.3, 60) % 500, return_counts=True)
            keep = rng.permutation(ids.size)
            parts.append((ids[keep], counts[keep]))
        ids = np.concatenate([p[0] for p in parts]).astype(np.int64)
        counts = np.concatenate([p[1] for p in parts]).astype(np.int64)
        rows = [t.lookup_or_insert(ids, step=step, counts=counts).numpy() for t in (plain, cached)]
        np.testing.assert_array_equal(rows[1], rows[0], err_msg=f"step {step}")
        ref.lookup(ids, counts, step)
        np.testing.assert_array_equal(cached.cached_ids(), sorted(ref.cached),
                                      err_msg=f"step {step}")
        s = cached.cache_stats()
        assert (s["hits"], s["lookups"], s["admitted"], s["evicted"]) == (
            ref.hits, ref.lookups, ref.admitted, ref.evicted), f"step {step}"
        grads = tf.constant(rng.normal(size=(ids.size, 3)).astype(np.float32))
        for t in (plain, cached):
            t.apply_gradients(ids, grads, step=step)
    if capacity == 16:
        assert ref.evicted > 0  # the LFU replacement was exercised
    _assert_same_export(plain, cached)


def test_ids_that_turn_hot_enter_without_a_rebalance():
    cached = HashTable(2, cache=MixCacheConfig(capacity=2, min_count=2))
    cached.lookup_or_insert(np.array([1, 2, 3]), step=1, counts=np.array([5, 4, 1]))
    np.testing.assert_array_equal(cached.cached_ids(), [1, 2])
    # 3 comes back once per step: at frequency 5 it beats 2 (4), the coldest cached id.
    for step in range(2, 6):
        cached.lookup_or_insert(np.array([3]), step=step)
    np.testing.assert_array_equal(cached.cached_ids(), [1, 3])
    s = cached.cache_stats()
    assert (s["admitted"], s["evicted"], s["hits"]) == (3, 1, 4 + 3 + 0)


def _top_by_frequency(snapshot, k):
    """NumPy reference of the rebalance's choice: admitted ids by frequency, ties by id."""
    ids, freq = snapshot.ids.numpy(), snapshot.freq.numpy()
    adm = snapshot.admitted.numpy()
    ids, freq = ids[adm], freq[adm]
    order = np.lexsort((ids, -freq))[:k]
    return np.sort(ids[order])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_rebalance_caches_exactly_the_most_frequent_ids_and_changes_no_row(optimizer):
    rng = np.random.default_rng(3)
    opt = OPTIMIZERS[optimizer]
    plain = HashTable(4, optimizer=opt, admit_after=2)
    cached = HashTable(4, cache=MixCacheConfig(capacity=10, min_count=50), optimizer=opt,
                                admit_after=2)
    for step in range(1, 31):
        ids, counts = np.unique(rng.zipf(1.2, 200) % 300, return_counts=True)
        # Ties in frequency at the capacity boundary are common: they go to the lower ids.
        rows = [t.lookup_or_insert(ids, step=step, counts=counts).numpy() for t in (plain, cached)]
        np.testing.assert_array_equal(rows[1], rows[0])
        grads = tf.constant(rng.normal(size=(ids.size, 4)).astype(np.float32))
        for t in (plain, cached):
            t.apply_gradients(ids, grads, step=step)
        if step % 5 == 0:
            dirty_before = cached.cache_stats()["written_back"]
            assert cached.rebalance() == 10
            # Rows, slots and counters unchanged: the cached table still exports (and so
            # writes back) exactly what the plain table holds.
            np.testing.assert_array_equal(cached.cached_ids(),
                                          _top_by_frequency(plain.export(), 10))
            assert step == 5 or cached.cache_stats()["written_back"] > dirty_before
            _assert_same_export(plain, cached)
            probe = np.arange(-3, 305)
            np.testing.assert_array_equal(cached.lookup(probe).numpy(), plain.lookup(probe).numpy())
    # Fewer rows than capacity: all of them are cached.
    small = HashTable(2, cache=MixCacheConfig(capacity=8, min_count=100))
    small.lookup_or_insert(np.array([4, 5, 6]), step=1)
    assert small.cache_stats()["size"] == 0
    assert small.rebalance() == 3
    np.testing.assert_array_equal(small.cached_ids(), [4, 5, 6])
    assert HashTable(2, cache=MixCacheConfig(capacity=8)).rebalance() == 0


def test_rebalance_refuses_a_table_without_a_cache():
    plain = HashTable(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"the table has no cache"):
        table_ops.rebalance_cache(plain.handle)
    with pytest.raises(ValueError, match=r"has no cache: rebalance needs one"):
        plain.rebalance()


def test_cached_table_ops_refuse_a_dim_the_table_does_not_have():
    table = HashTable(2, cache=MixCacheConfig(capacity=8))
    ids = tf.constant([1, 2], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="the table has dim 2 but the op was built for dim 3"):
        table_ops.lookup(table.handle, ids, dim=3)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="the table has dim 2 but the op was built for dim 3"):
        table_ops.lookup_or_insert(table.handle, ids, dim=3, step=1)
