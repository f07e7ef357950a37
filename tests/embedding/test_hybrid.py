"""Hybrid training (PERSIA) under real `horovodrun -np 2`: s=0 is synchronous training,
s>0 stays within its bound and applies every update exactly once, in order; a MixCache
changes nothing but speed."""

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf.embedding import Adagrad, FeatureConfig, HashTable, ShardedHashEmbedding, TableConfig
from gmeta_tf.training.hybrid import HybridTrainer, check_staleness
from tests.embedding.hybrid_worker import STEPS
from tests.multiprocess import load_ranks, run_ranks

WORKER = "tests.embedding.hybrid_worker"
TABLES = {"a": 4, "b": 3}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("hybrid")
    run_ranks(WORKER, str(out), np_=2)
    return load_ranks(out, 2)


def _merged(results, run):
    """Every rank's shard of each table, merged and sorted by id: {table: {field: array}}."""
    merged = {}
    for table in TABLES:
        ids = np.concatenate([r[f"{run}/table/{table}/ids"] for r in results])
        order = np.argsort(ids, kind="stable")
        merged[table] = {
            field: np.concatenate([r[f"{run}/table/{table}/{field}"] for r in results])[order]
            for field in ("ids", "values", "slots", "freq", "last_seen")
        }
    return merged


@pytest.mark.horovod
def test_staleness_zero_is_synchronous_training_exactly(two_ranks):
    sync, hybrid = _merged(two_ranks, "sync"), _merged(two_ranks, "h0")
    for table in TABLES:
        for field, value in sync[table].items():
            np.testing.assert_array_equal(hybrid[table][field], value, err_msg=f"{table}/{field}")
    for rank in two_ranks:
        np.testing.assert_array_equal(rank["h0/losses"], rank["sync/losses"])
        for key in (k for k in rank if k.startswith("sync/dense/")):
            np.testing.assert_array_equal(rank[key.replace("sync/", "h0/")], rank[key])
        # Same communication as the plain layer: per step one all-to-all of ids and one
        # of rows forward, one of gradients back, one all-reduce.
        for kind, per_step in (("alltoall", 2), ("alltoall_grad", 1), ("allreduce", 1)):
            assert int(rank[f"h0/count/{kind}_calls"]) == per_step * STEPS
            assert int(rank[f"h0/count/{kind}_bytes"]) == int(rank[f"sync/count/{kind}_bytes"])
        assert rank["h0/staleness_hist"].tolist() == [STEPS]


def _replay(results, run):
    """Replays the recorded run on one plain table per table: insert each batch's ids,
    apply each batch's recorded gradients (all ranks', scaled by 1/size) in batch order,
    exactly as many updates before each pull as the run's counters say it had applied.
    Checks every pulled row on the way; returns the final tables."""
    size = len(results)
    tables = {t: HashTable(dim, optimizer=Adagrad(0.1)) for t, dim in TABLES.items()}
    applied = 0

    def apply(k):
        for t, table in tables.items():
            ids = np.concatenate([r[f"{run}/rec/{k}/{t}/ids"] for r in results])
            grads = np.concatenate([r[f"{run}/rec/{k}/{t}/grads"] for r in results])
            table.apply_gradients(ids, tf.constant(grads) * (1.0 / size), step=k + 1)

    for m in range(STEPS):
        before = {int(r[f"{run}/rec/{m}/applied"]) for r in results}
        assert len(before) == 1, f"ranks disagree on the updates applied before pull {m}"
        before = before.pop()
        assert m - 2 <= before <= m, f"batch {m} pulled with {m - before} updates missing"
        while applied < before:
            apply(applied)
            applied += 1
        for rank in results:
            for t, table in tables.items():
                rows = table.lookup_or_insert(rank[f"{run}/rec/{m}/{t}/ids"], step=m + 1)
                np.testing.assert_array_equal(rows.numpy(), rank[f"{run}/rec/{m}/{t}/rows"],
                                              err_msg=f"batch {m} table {t}")
    while applied < STEPS:
        apply(applied)
        applied += 1
    return {t: table.export() for t, table in tables.items()}


@pytest.mark.horovod
def test_bounded_staleness_applies_every_update_once_in_order(two_ranks):
    for rank in two_ranks:
        hist = rank["h2/staleness_hist"]
        # Counted by the trainer: never above the bound, and the bound is used.
        assert len(hist) == 3 and hist.sum() == STEPS and int(rank["h2/staleness_max"]) == 2
        seen = [m - int(rank[f"h2/rec/{m}/applied"]) for m in range(STEPS)]
        assert np.bincount(seen, minlength=3).tolist() == hist.tolist()
        assert int(rank["h2/count/alltoall_grad_calls"]) == STEPS  # one push per batch
    replayed = _replay(two_ranks, "h2")
    trained = _merged(two_ranks, "h2")
    for t in TABLES:
        np.testing.assert_array_equal(trained[t]["ids"], replayed[t].ids.numpy())
        np.testing.assert_array_equal(trained[t]["values"], replayed[t].values.numpy())
        np.testing.assert_array_equal(trained[t]["slots"], replayed[t].slots.numpy())
    # Stale rows really changed training (the test would be vacuous otherwise).
    assert not np.array_equal(two_ranks[0]["h2/losses"], two_ranks[0]["sync/losses"])


@pytest.mark.horovod
@pytest.mark.parametrize("run", ["h2c", "h2w"])
def test_mix_cache_trains_and_exports_the_same_rows(two_ranks, run):
    for rank in two_ranks:
        np.testing.assert_array_equal(rank[f"{run}/losses"], rank["h2/losses"])
        for m in range(STEPS):
            for t in TABLES:
                np.testing.assert_array_equal(rank[f"{run}/rec/{m}/{t}/rows"],
                                              rank[f"h2/rec/{m}/{t}/rows"])
    cached, plain = _merged(two_ranks, run), _merged(two_ranks, "h2")
    for t in TABLES:
        for field, value in plain[t].items():  # rows, slots, and the counters too
            np.testing.assert_array_equal(cached[t][field], value, err_msg=f"{t}/{field}")
    # The equalities above cover the path the run exercised: h2c mostly through the cache,
    # h2w (one slot per shard, ids admitted on their second lookup) mostly past it.
    hits = sum(int(r[f"{run}/cache/a/hits"]) for r in two_ranks)
    lookups = sum(int(r[f"{run}/cache/a/lookups"]) for r in two_ranks)
    assert all(int(r[f"{run}/cache/a/size"]) <= int(r[f"{run}/cache/a/capacity"])
               for r in two_ranks)
    if run == "h2c":
        assert hits > 0.2 * lookups
    else:
        assert lookups > 0 and lookups - hits > 0.5 * lookups


def test_bad_staleness_names_the_value_and_what_is_allowed():
    for bad in (-1, 1.5, True, "2", None):
        with pytest.raises(ValueError, match=r"staleness must be an integer >= 0.*got"):
            check_staleness(bad)
    assert check_staleness(np.int64(3)) == 3
    layer = ShardedHashEmbedding([TableConfig("t", 2)], [FeatureConfig("x", "t")])
    with pytest.raises(ValueError, match="got -2"):
        HybridTrainer(layer, lambda e, b: 0.0, [], tf.keras.optimizers.SGD(), staleness=-2)
    with pytest.raises(TypeError, match="must be a ShardedHashEmbedding"):
        HybridTrainer(object(), lambda e, b: 0.0, [], tf.keras.optimizers.SGD())


def test_an_error_in_the_dense_step_stops_both_threads():
    layer = ShardedHashEmbedding([TableConfig("t", 2)], [FeatureConfig("x", "t")])

    def loss_fn(embedded, batch):
        raise ValueError("tower exploded")

    trainer = HybridTrainer(layer, loss_fn, [], tf.keras.optimizers.SGD(), staleness=1)
    batches = [{"x": tf.constant([1, 2], tf.int64)}] * 4
    with pytest.raises(ValueError, match="tower exploded"):
        trainer.fit(batches)
