"""A dataset under a URI with a scheme is read through TensorFlow's file systems (which
tensorflow-io extends with s3:// and hdfs://): here TensorFlow's own in-memory ram://
file system stands in for a remote store, and the batches equal those of the local copy."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from gmeta_tf import data
from gmeta_tf.data import filesystem as fs


def _copy_to(local: str, uri: str) -> None:
    for root, _, files in os.walk(local):
        rel = os.path.relpath(root, local)
        target = uri if rel == "." else f"{uri}/{rel}"
        tf.io.gfile.makedirs(target)
        for name in files:
            tf.io.gfile.copy(os.path.join(root, name), f"{target}/{name}", overwrite=True)


def test_a_dataset_under_a_uri_reads_like_its_local_copy(dataset):
    uri = f"ram://gmeta-test/{dataset.name}-{dataset.parent.name}"
    _copy_to(str(dataset), uri)
    assert fs.is_remote(uri) and not os.path.exists(uri)

    def batches(path: str) -> list[dict]:
        return [tf.nest.map_structure(lambda t: t.numpy(), b)
                for b in data.read_tasks(path, 4, 5, 3, split="warm", shuffle_seed=1)]

    local, remote = batches(str(dataset)), batches(uri)
    assert len(local) == len(remote) > 0
    for a, b in zip(local, remote):
        tf.nest.map_structure(np.testing.assert_array_equal, a, b)
