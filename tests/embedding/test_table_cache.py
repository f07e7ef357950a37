"""TableConfig.cache: a MixCache per table in the table's own config (``caches=`` still works;
both for one table is refused); a cached layer trains the rows an uncached one trains."""

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.embedding import (
    Adagrad,
    FeatureConfig,
    HashTable,
    MixCacheConfig,
    ShardedHashEmbedding,
    TableConfig,
)


def _layer(cache_a=None, caches=None, name="emb"):
    return ShardedHashEmbedding(
        [TableConfig("a", 3, optimizer=Adagrad(0.1), cache=cache_a),
         TableConfig("b", 3, optimizer=Adagrad(0.1))],
        [FeatureConfig("x", "a"), FeatureConfig("y", "b")], caches=caches, name=name)


def _train(layer, steps=4):
    rng = np.random.default_rng(0)
    for _ in range(steps):
        batch = {"x": tf.constant(rng.zipf(1.5, 16) % 20, tf.int64),
                 "y": tf.constant(rng.integers(0, 5, 16), tf.int64)}
        with tf.GradientTape() as tape:
            out = layer(batch, training=True)
            loss = tf.reduce_sum(tf.square(out["x"] - 1.0)) + tf.reduce_sum(out["y"])
        tape.gradient(loss, layer.trainable_variables)
    return {t: {k: v.numpy() for k, v in s.export()._asdict().items()}
            for t, s in layer.shards.items()}


def test_table_config_cache_puts_a_mix_cache_in_front_of_that_table():
    layer = _layer(MixCacheConfig(capacity=4, min_count=1))
    assert isinstance(layer.shards["a"], HashTable) and layer.shards["a"].cache is not None
    assert type(layer.shards["b"]) is HashTable and layer.shards["b"].cache is None
    assert layer.cache_configs == {"a": MixCacheConfig(capacity=4, min_count=1)}
    cached = _train(layer)
    plain = _train(_layer(name="plain"))
    for table in ("a", "b"):
        for field, value in plain[table].items():
            np.testing.assert_array_equal(cached[table][field], value, err_msg=f"{table}/{field}")
    assert layer.table_sizes() == {"a": len(plain["a"]["ids"]), "b": len(plain["b"]["ids"])}
    stats = layer.cache_stats()
    assert list(stats) == ["a"] and stats["a"]["lookups"] > 0
    assert "cache" not in layer.get_config()["tables"][0]  # listed once, under caches
    assert layer.get_config()["caches"]["a"]["capacity"] == 4


def test_caches_argument_still_works_and_both_for_one_table_is_refused():
    layer = _layer(caches={"a": MixCacheConfig(capacity=4)})
    assert layer.shards["a"].cache == MixCacheConfig(capacity=4)
    with pytest.raises(ValueError, match="table 'a' has a cache both in its TableConfig.cache "
                                         r"\(.*\) and in caches= \(.*\): give it once"):
        _layer(MixCacheConfig(capacity=4), caches={"a": MixCacheConfig(capacity=8)})
    with pytest.raises(TypeError, match="TableConfig 'a': cache must be a MixCacheConfig or "
                                        "None, got 100"):
        TableConfig("a", 3, cache=100)


def test_rebalance_caches_refills_the_caches_that_are_due():
    layer = _layer(MixCacheConfig(capacity=4, min_count=1, rebalance_every=3))
    _train(layer)
    assert layer.rebalance_caches(step=2) == 0
    assert layer.rebalance_caches(step=6) == 1  # table "a" only: "b" has no cache
    assert len(layer.shards["a"].cached_ids()) == 4
    assert _layer(name="plain").rebalance_caches(step=3) == 0
