"""ShardedHashEmbedding under real `horovodrun -np 2` (Gloo), against one process."""

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf import distributed
from gmeta_tf.embedding import (
    Adagrad,
    FeatureConfig,
    HashEmbedding,
    ShardedHashEmbedding,
    TableConfig,
)
from tests.multiprocess import load_ranks, run_ranks

WORKER = "tests.embedding.sharded_worker"


def _merged_tables(results):
    """The union of every rank's shards, sorted by id, per table and field."""
    merged = {}
    for key in results[0]:
        if not key.startswith("table/"):
            continue
        parts = [r[key] for r in results]
        ids = np.concatenate([r[key.rsplit("/", 1)[0] + "/ids"] for r in results])
        merged[key] = np.concatenate(parts)[np.argsort(ids, kind="stable")]
    return merged


SCENARIOS = ("sgd", "adagrad", "skew")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every scenario trained by one process and by 2 ranks (one launch each); the 2 ranks
    also checkpoint the adagrad model. Returns {(np_, scenario): ranks' results} and the
    checkpoint root."""
    root = tmp_path_factory.mktemp("sharded")
    ckpt = root / "ckpt"
    run_ranks(WORKER, "train", str(root / "np1"), *SCENARIOS, np_=1)
    run_ranks(WORKER, "train", str(root / "np2"), *SCENARIOS, "--save", str(ckpt), np_=2)
    results = {(np_, s): load_ranks(root / f"np{np_}" / s, np_)
               for np_ in (1, 2) for s in SCENARIOS}
    return results, ckpt


@pytest.mark.horovod
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_two_ranks_on_half_batches_equal_one_rank_on_the_whole(runs, optimizer):
    one, two = runs[0][(1, optimizer)], runs[0][(2, optimizer)]
    tables_one, tables_two = _merged_tables(one), _merged_tables(two)
    assert tables_one.keys() == tables_two.keys()
    for key in tables_one:
        np.testing.assert_allclose(tables_two[key], tables_one[key], rtol=1e-5, atol=1e-5,
                                   err_msg=key)
    for key in (k for k in one[0] if k.startswith("dense/")):
        for rank in two:
            np.testing.assert_allclose(rank[key], one[0][key], rtol=1e-5, atol=1e-5, err_msg=key)
    for rank in two:  # and both ranks predict as the one process
        np.testing.assert_allclose(rank["predictions"], one[0]["predictions"], rtol=1e-5,
                                   atol=1e-5)
    # Both ranks hold rows (the tables really are sharded) and share no id.
    ids = [set(r["table/a/ids"].tolist()) for r in two]
    assert ids[0] and ids[1] and not ids[0] & ids[1]
    # One all-to-all of ids and one of rows forward, one of gradients back, per step.
    steps = 5
    for rank in two:
        # + 2 inference calls: the one that builds the model and the predictions
        assert int(rank["count/alltoall_calls"]) == 2 * (steps + 2)
        assert int(rank["count/alltoall_grad_calls"]) == steps
        assert int(rank["count/allreduce_calls"]) == steps


@pytest.mark.horovod
def test_a_rank_that_receives_no_ids_still_works(runs):
    one, two = runs[0][(1, "skew")], runs[0][(2, "skew")]
    assert two[1]["table/a/ids"].size == 0 and two[1]["table/b/ids"].size == 0
    tables_one, tables_two = _merged_tables(one), _merged_tables(two)
    for key in tables_one:
        np.testing.assert_allclose(tables_two[key], tables_one[key], rtol=1e-5, atol=1e-5)


@pytest.mark.horovod
@pytest.mark.parametrize("np_", [1, 2])
def test_checkpoint_saved_by_two_ranks_restores_onto_one_and_two(runs, tmp_path, np_):
    """In a new process, on one rank and on two."""
    results, ckpt = runs
    saved = results[(2, "adagrad")]
    run_ranks(WORKER, "restore", str(tmp_path), str(ckpt), np_=np_)
    restored = load_ranks(tmp_path, np_)
    for rank in restored:
        np.testing.assert_allclose(rank["predictions"], saved[0]["predictions"],
                                   rtol=1e-6, atol=1e-7)
    # Restored shards hold exactly the saved rows, each id on its new owner.
    before, after = _merged_tables(saved), _merged_tables(restored)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])


def test_single_process_matches_hash_embedding():
    """At size 1 the sharded layer is the plain layer: same rows, same training."""
    rng = np.random.default_rng(0)
    sharded = ShardedHashEmbedding([TableConfig("t", 4, optimizer=Adagrad(0.1))],
                                   [FeatureConfig("x", "t")])
    plain = HashEmbedding(4, optimizer=Adagrad(0.1))
    for _ in range(3):
        ids = tf.constant(rng.integers(0, 30, (8, 3)))
        for layer, get in ((sharded, lambda o: o["x"]), (plain, lambda o: o)):
            with tf.GradientTape() as tape:
                out = get(layer({"x": ids}) if layer is sharded else layer(ids))
                loss = tf.reduce_mean(tf.square(tf.reduce_sum(out, [1, 2]) - 1.0))
            tape.gradient(loss, layer.trainable_variables)
    a, b = sharded.shards["t"].export(), plain.table.export()
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-6)


def test_config_errors_name_the_culprit():
    with pytest.raises(ValueError, match="feature 'x' uses table 'nope'"):
        ShardedHashEmbedding([TableConfig("t", 4)], [FeatureConfig("x", "nope")])
    with pytest.raises(ValueError, match="table names must be unique"):
        ShardedHashEmbedding([TableConfig("t", 4), TableConfig("t", 8)], [])
    with pytest.raises(ValueError, match="TableConfig 't': dim = 0 is not allowed: "
                                         "expected an integer >= 1"):
        TableConfig("t", 0)
    layer = ShardedHashEmbedding([TableConfig("t", 4)], [FeatureConfig("x", "t")])
    with pytest.raises(KeyError, match=r"no feature\(s\) \['x'\]"):
        layer({"y": tf.constant([1], tf.int64)})
    assert distributed.size() == 1
