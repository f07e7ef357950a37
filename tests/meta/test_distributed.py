"""Two ranks with T/2 tasks each end where one rank with all T tasks ends; one embedding
exchange each way per meta step, counted."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf import distributed
from gmeta_tf.meta import MetaConfig
from tests.conftest import PROJECT_ROOT
from tests.meta import meta_step_worker, tiny

PYTHON = sys.executable


ALGORITHMS = ("maml", "reptile")  # fomaml is maml with constant inner gradients


def _two_ranks(out_dir):
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONPATH=str(PROJECT_ROOT))
    horovodrun = shutil.which("horovodrun") or os.path.join(os.path.dirname(PYTHON), "horovodrun")
    cmd = [horovodrun, "-np", "2", "-H", "localhost:2", PYTHON, "-m",
           "tests.meta.meta_step_worker", str(out_dir), ",".join(ALGORITHMS)]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.horovod
def test_two_ranks_with_half_the_tasks_equal_one_rank_with_all(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    _two_ranks(tmp_path / "two")
    steps = meta_step_worker.STEPS
    for algorithm in ALGORITHMS:
        meta_step_worker.main(str(tmp_path / "one"), algorithm)  # one rank, in this process
        one = dict(np.load(tmp_path / "one" / f"{algorithm}_rank0.npz"))
        two = [dict(np.load(tmp_path / "two" / f"{algorithm}_rank{r}.npz")) for r in range(2)]
        for key, value in one.items():
            if key.startswith("count:"):
                continue
            for r in range(2):
                np.testing.assert_allclose(two[r][key], value, rtol=2e-4, atol=2e-6,
                                           err_msg=f"{algorithm} rank {r} {key}")
        for counts in (one, *two):
            assert counts["count:alltoall_calls"] == 2 * steps   # ids out + rows back
            assert counts["count:alltoall_grad_calls"] == steps  # row gradients back


@pytest.mark.parametrize("inner_steps", [1, 5])
def test_one_exchange_each_way_per_meta_step_whatever_the_inner_steps(inner_steps):
    model = tiny.model(MetaConfig("maml", inner_steps=inner_steps, inner_lr=0.1))
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1))
    step = tf.function(model.train_step)
    batch = tiny.tasks(6, seed=3)
    distributed.reset_collective_counts()
    for _ in range(3):
        step(batch)
    counts = distributed.collective_counts()
    assert counts["alltoall_calls"] == 6        # 3 steps x (ids out, rows back)
    assert counts["alltoall_grad_calls"] == 3   # 3 steps x row gradients back
