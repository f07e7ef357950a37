"""MixCache against the plain table: same rows, slots and counters after any sequence of
lookups, updates, rebalances, evictions, exports and imports; hit counting; bad input."""

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf import ops
from gmeta_tf.embedding import (
    SGD,
    Adagrad,
    Adam,
    FeatureConfig,
    HashTable,
    MixCacheConfig,
    MixCachedHashTable,
    ShardedHashEmbedding,
    TableConfig,
)

OPTIMIZERS = {"sgd": SGD(0.1), "adagrad": Adagrad(0.1), "adam": Adam(0.01)}


def _assert_same_export(a, b):
    for field, x, y in zip(ops.TableSnapshot._fields, a.export(), b.export()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=field)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_cached_table_trains_exactly_like_the_plain_table(optimizer):
    rng = np.random.default_rng(0)
    opt = OPTIMIZERS[optimizer]
    plain = HashTable(4, optimizer=opt)
    cached = MixCachedHashTable(4, MixCacheConfig(capacity=12, min_count=2), optimizer=opt)
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
    cached = MixCachedHashTable(2, MixCacheConfig(capacity=2, min_count=2), optimizer=SGD(0.5))

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
    cached = MixCachedHashTable(3, MixCacheConfig(capacity=4, min_count=1), optimizer=Adagrad(0.1))
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
    with pytest.raises(ValueError, match=r"capacity must be an integer >= 1, got 0"):
        MixCacheConfig(capacity=0)
    with pytest.raises(ValueError, match=r"capacity must be an integer >= 1, got 1.5"):
        MixCacheConfig(capacity=1.5)
    with pytest.raises(ValueError, match=r"min_count must be an integer >= 1, got -1"):
        MixCacheConfig(capacity=10, min_count=-1)
    with pytest.raises(ValueError, match=r"rebalance_every must be an integer >= 0, got -3"):
        MixCacheConfig(capacity=10, rebalance_every=-3)
    with pytest.raises(ValueError, match=r"below 2\*\*31"):
        MixCacheConfig(capacity=2**31)
    with pytest.raises(ValueError, match=r"admit_after <= 1.*admit_after=3"):
        MixCachedHashTable(4, MixCacheConfig(8), admit_after=3, name="t")
    with pytest.raises(ValueError, match=r"caches: 'nope' is not one of the tables \['t'\]"):
        ShardedHashEmbedding([TableConfig("t", 4)], [FeatureConfig("x", "t")],
                             caches={"nope": MixCacheConfig(8)})
    with pytest.raises(TypeError, match=r"caches\['t'\] must be a MixCacheConfig"):
        ShardedHashEmbedding([TableConfig("t", 4)], [FeatureConfig("x", "t")],
                             caches={"t": 100})
