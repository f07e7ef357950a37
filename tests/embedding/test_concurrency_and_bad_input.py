"""Concurrent use of one table, and bad input that must raise clear errors."""

import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf import ops
from gmeta_tf.embedding import table_ops
from gmeta_tf.embedding import SGD, Adagrad, HashEmbedding, HashTable
from tests.embedding.reference import initial_row


def _run_threads(target, n):
    errors = []

    def guarded(i):
        try:
            target(i)
        except Exception as err:  # surfaced below, with the thread's index
            errors.append((i, err))

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_parallel_inserts_build_the_union_with_initial_rows():
    table = HashTable(dim=4)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 50_000, size=20_000).astype(np.int64) for _ in range(8)]

    def work(i):
        for chunk in np.array_split(batches[i], 10):
            table.lookup_or_insert(tf.constant(chunk), step=i)

    _run_threads(work, 8)
    union = np.unique(np.concatenate(batches))
    assert int(table.size()) == len(union)
    snap = table.export()
    np.testing.assert_array_equal(snap.ids.numpy(), union)
    np.testing.assert_array_equal(snap.freq.numpy().sum(), sum(len(b) for b in batches))
    for k in union[::997]:
        np.testing.assert_array_equal(snap.values.numpy()[np.searchsorted(union, k)],
                                      initial_row(int(k), 4))


def test_parallel_updates_and_lookups_lose_no_update():
    """SGD steps commute: N threads x K steps of gradient 1 move each row by -lr*N*K."""
    ids = np.arange(-500, 500, dtype=np.int64)
    table = HashTable(dim=4, optimizer=SGD(0.001))
    init = table.lookup_or_insert(tf.constant(ids)).numpy()
    threads, steps = 6, 20

    def work(i):
        grads = tf.ones([len(ids), 4])
        for s in range(steps):
            table.apply_gradients(tf.constant(ids), grads)
            table.lookup_or_insert(tf.constant(ids[(s * 37) % 900:][:100]), step=s)
            table.lookup(tf.constant(ids[:50]))

    _run_threads(work, threads)
    np.testing.assert_allclose(table.lookup(tf.constant(ids)).numpy(),
                               init - 0.001 * threads * steps, rtol=0, atol=1e-5)


# ---- bad input -------------------------------------------------------------------------

def test_float_ids_are_rejected_with_the_dtype_named():
    table = HashTable(dim=2)
    with pytest.raises(TypeError, match="int64.*float32"):
        table.lookup_or_insert(tf.constant([1.0, 2.0]))


def test_int32_ids_are_widened():
    table = HashTable(dim=2)
    np.testing.assert_array_equal(table.lookup_or_insert(tf.constant([3], tf.int32)).numpy(),
                                  [initial_row(3, 2)])


def test_ids_of_wrong_rank_are_rejected():
    table = HashTable(dim=2)
    with pytest.raises(ValueError, match="rank 1"):
        table.lookup_or_insert(tf.constant([[1, 2]], tf.int64))

    @tf.function(input_signature=[tf.TensorSpec(None, tf.int64)])
    def unknown_rank(ids):
        return table.lookup_or_insert(ids)

    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        unknown_rank(tf.constant([[1, 2]], tf.int64))


@pytest.mark.parametrize("dim", [0, -3, 2.5, True])
def test_non_positive_dims_are_rejected(dim):
    with pytest.raises(ValueError, match="dim must be a positive integer"):
        HashTable(dim=dim)


def test_bad_table_options_are_rejected():
    with pytest.raises(ValueError, match="initializer"):
        HashTable(dim=2, initializer="glorot")
    with pytest.raises(ValueError, match="admit_after"):
        HashTable(dim=2, admit_after=-1)
    with pytest.raises(ValueError, match="learning_rate"):
        Adagrad(learning_rate=-1.0)
    with pytest.raises(ValueError, match="combiner"):
        HashEmbedding(4, combiner="max")


def test_gradients_of_the_wrong_shape_are_rejected():
    table = HashTable(dim=4, optimizer=SGD(0.1))
    table.lookup_or_insert(tf.constant([1, 2], tf.int64))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="4"):
        table.apply_gradients(tf.constant([1, 2], tf.int64), tf.ones([2, 3]))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        table.apply_gradients(tf.constant([1, 2], tf.int64), tf.ones([3, 4]))
    with pytest.raises(TypeError, match="float32"):
        table.apply_gradients(tf.constant([1, 2], tf.int64), tf.ones([2, 4], tf.float64))


def test_an_optimizer_needing_more_slots_than_the_table_has_is_rejected():
    table = HashTable(dim=2, optimizer=SGD(0.1))
    table.lookup_or_insert(tf.constant([1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="needs 1 slots"):
        table_ops.apply_gradients(table.handle, [1], tf.ones([1, 2]), "adagrad", 0.1)


def test_import_of_another_dim_is_rejected_and_keeps_the_table():
    source = HashTable(dim=3)
    source.lookup_or_insert(tf.constant([1, 2], tf.int64))
    target = HashTable(dim=4)
    target.lookup_or_insert(tf.constant([9], tf.int64))
    with pytest.raises(ValueError, match="dim 3.* into table .* dim 4"):
        target.import_(source.export())
    with pytest.raises(tf.errors.InvalidArgumentError, match="shape"):
        snap = source.export()
        table_ops.import_table(target.handle, snap)
    np.testing.assert_array_equal(target.export().ids.numpy(), [9])


def _load_in_subprocess(library_path, tmp_path):
    code = (
        "from gmeta_tf import ops\n"
        "try:\n"
        "    ops.library()\n"
        "except ops.OpLibraryError as err:\n"
        "    print('CLEAN ERROR:', err)\n"
    )
    env = dict(os.environ, GMETA_OPS_LIBRARY=str(library_path))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


def test_missing_library_gives_a_clear_error(tmp_path):
    result = _load_in_subprocess(tmp_path / "nowhere.so", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "CLEAN ERROR" in result.stdout and "not found" in result.stdout
    assert "make setup" in result.stdout


def test_library_built_for_another_tensorflow_gives_a_clear_error(tmp_path):
    lib = tmp_path / "libgmeta_ops.so"
    shutil.copy(ops.LIBRARY_PATH, lib)
    lib.with_suffix(".tfversion").write_text("2.99.0\n")
    result = _load_in_subprocess(lib, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "built for TensorFlow 2.99.0" in result.stdout


def test_corrupt_library_gives_a_clear_error(tmp_path):
    lib = tmp_path / "libgmeta_ops.so"
    lib.write_bytes(b"\x7fELF this is not a shared object" * 10)
    lib.with_suffix(".tfversion").write_text(tf.__version__)
    result = _load_in_subprocess(lib, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "CLEAN ERROR" in result.stdout and "cannot load" in result.stdout
