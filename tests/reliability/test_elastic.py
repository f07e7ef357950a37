"""Elastic training under ``horovodrun --min-np 1 --max-np 2 --host-discovery-script``:
the world goes 2 -> 1 -> 2 ranks mid-run, the tables are resharded from the last commit
each time, and the run ends with every row of every table on its owner, with the weights
of an uninterrupted single-process run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf import ops
from tests.reliability import elastic_worker as worker
from tests.reliability.launch import GLOO_TIMEOUT_SECONDS, HOROVODRUN, Job

WORKER = [sys.executable, "-m", "tests.reliability.elastic_worker"]


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def sizes_by_step(log: Path) -> dict[int, int]:
    """Step -> world size it was (last) trained at, from a rank's progress log."""
    sizes = {}
    for line in log.read_text().split("\n"):
        if line:
            step, size, _ = map(int, line.split())
            sizes[step] = size
    return sizes


def merged(ranks: list[dict[str, np.ndarray]], table: str) -> dict[str, np.ndarray]:
    fields = {f: np.concatenate([r[f"table/{table}/{f}"] for r in ranks])
              for f in ("ids", "values", "slots")}
    order = np.argsort(fields["ids"])
    return {f: v[order] for f, v in fields.items()}


@pytest.mark.horovod
def test_two_to_one_to_two_ranks_loses_no_row(tmp_path):
    out, reference = tmp_path / "elastic", tmp_path / "reference"
    out.mkdir()
    reference.mkdir()
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    discover = tmp_path / "discover_hosts.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    command = [str(HOROVODRUN), "-np", "2", "--min-np", "1", "--max-np", "2",
               "--host-discovery-script", str(discover), "--network-interface", "lo",
               "--gloo-timeout-seconds", str(GLOO_TIMEOUT_SECONDS), *WORKER, str(out),
               str(tmp_path / "commits"), "--hosts-file", str(hosts)]
    elastic_job = Job(command, tmp_path / "elastic.log")
    Job([*WORKER, str(reference), str(tmp_path / "reference_commits")],
        tmp_path / "reference.log").run_to_end(timeout=300)
    elastic_job.run_to_end(timeout=400)

    # The world really went 2 -> 1 -> 2 (rank 0 trained every step, at these sizes).
    sizes = sizes_by_step(out / "steps.rank0.log")
    assert sorted(sizes) == list(range(1, worker.STEPS + 1))
    assert [sizes[s] for s in (1, 6, 7, 12, 13, worker.STEPS)] == [2, 2, 1, 1, 2, 2], sizes

    ranks = [load(out / f"final.rank{r}-of-2.npz") for r in range(2)]
    expected = load(reference / "final.rank0-of-1.npz")
    batches = [worker.global_batch(s)[0] for s in range(worker.STEPS)]
    ids_of = {"a": np.unique(np.concatenate([np.concatenate([b["f1"], b["f2"].ravel()])
                                             for b in batches])),
              "b": np.unique(np.concatenate([b["g"].flat_values.numpy() for b in batches]))}
    for table, ids in ids_of.items():
        for rank, shard in enumerate(ranks):
            owners = ops.partition_of(tf.constant(shard[f"table/{table}/ids"]), 2).numpy()
            assert (owners == rank).all(), f"table {table}: rank {rank} holds ids it does not own"
        rows = merged(ranks, table)
        # Every id ever looked up is there exactly once, and nothing else.
        np.testing.assert_array_equal(rows["ids"], ids)
        single = merged([expected], table)
        np.testing.assert_array_equal(rows["ids"], single["ids"])
        for field in ("values", "slots"):
            np.testing.assert_allclose(rows[field], single[field], rtol=1e-5, atol=1e-6,
                                       err_msg=f"table {table} {field}")
    for name in (k for k in expected if k.startswith("dense/")):
        for shard in ranks:
            np.testing.assert_allclose(shard[name], expected[name], rtol=1e-5, atol=1e-6,
                                       err_msg=name)
