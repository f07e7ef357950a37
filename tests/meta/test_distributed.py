"""Two ranks with T/2 tasks each end where one rank with all T tasks ends; per meta step,
whatever the inner steps, two all-to-alls forward (ids out, rows back) and one back (row
gradients), in the traced graph and counted at run time (real ``horovodrun -np 2``)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from gmeta_tf.launcher import horovodrun
from tests.conftest import PROJECT_ROOT
from tests.meta import meta_step_worker

PYTHON = sys.executable


ALGORITHMS = ("maml", "reptile")  # fomaml is maml with constant inner gradients


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One launch of 2 ranks (as gmeta train --np 2 launches them): both algorithms trained, and the exchange counts."""
    out_dir = tmp_path_factory.mktemp("two_ranks")
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", PYTHONPATH=str(PROJECT_ROOT))
    cmd = [*horovodrun(), "-np", "2", "-H", "localhost:2", PYTHON, "-m",
           "tests.meta.meta_step_worker", str(out_dir), ",".join(ALGORITHMS + ("exchanges", "undone"))]
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return out_dir


@pytest.mark.horovod
def test_two_ranks_with_half_the_tasks_equal_one_rank_with_all(two_ranks, tmp_path):
    steps = meta_step_worker.STEPS
    for algorithm in ALGORITHMS:
        meta_step_worker.main(str(tmp_path), algorithm)  # one rank, in this process
        one = dict(np.load(tmp_path / f"{algorithm}_rank0.npz"))
        two = [dict(np.load(two_ranks / f"{algorithm}_rank{r}.npz")) for r in range(2)]
        for key, value in one.items():
            if key.startswith("count:"):
                continue
            for r in range(2):
                np.testing.assert_allclose(two[r][key], value, rtol=2e-4, atol=2e-6,
                                           err_msg=f"{algorithm} rank {r} {key}")
        for counts in (one, *two):
            assert counts["count:alltoall_calls"] == 2 * steps   # ids out + rows back
            assert counts["count:alltoall_grad_calls"] == steps  # row gradients back


@pytest.mark.horovod
@pytest.mark.parametrize("inner_steps", [1, 5])
def test_one_exchange_each_way_per_meta_step_whatever_the_inner_steps(two_ranks, inner_steps):
    """At 2 ranks, where the all-to-all is real: a MAML step's traced graph holds three
    Horovod all-to-alls (ids out and rows back forward, row gradients back), whatever k,
    and each of 3 steps runs each of them once on every rank."""
    for r in range(2):
        counts = dict(np.load(two_ranks / f"exchanges_rank{r}.npz"))
        assert counts[f"k{inner_steps}:graph_alltoalls"] == 3
        assert counts[f"k{inner_steps}:alltoall_calls"] == 6        # 3 x (ids out, rows back)
        assert counts[f"k{inner_steps}:alltoall_grad_calls"] == 3   # 3 x row gradients back


@pytest.mark.horovod
def test_a_diverged_task_on_one_rank_is_undone_without_the_ranks_falling_out_of_step(
        two_ranks, tmp_path):
    """At 2 ranks, a batch with a diverging task on one rank's share only: that rank alone
    computes the unadapted outputs (a ``tf.cond``) while the embedding reads stay
    all-to-alls of both ranks. Both ranks finish, the diverged task is marked undone and
    finite, and every figure equals one rank's on the whole batch."""
    meta_step_worker.undone(str(tmp_path))  # one rank, every task, in this process
    one = dict(np.load(tmp_path / "undone_rank0.npz"))
    two = [dict(np.load(two_ranks / f"undone_rank{r}.npz")) for r in range(2)]
    share = meta_step_worker.NUM_TASKS // 2
    for key, value in one.items():
        joined = np.concatenate([two[0][key], two[1][key]])
        np.testing.assert_allclose(joined, value, rtol=2e-4, atol=2e-5, err_msg=key)
        assert np.isfinite(joined).all(), key
    for name in ("meta", "baseline"):
        expected = np.ones(meta_step_worker.NUM_TASKS)
        expected[1] = 0.0
        np.testing.assert_array_equal(one[f"{name}0:kept"][:, 0], expected)
        expected = np.ones(meta_step_worker.NUM_TASKS)
        expected[-1] = 0.0
        np.testing.assert_array_equal(one[f"{name}1:kept"][:, 0], expected)
        assert two[1][f"{name}0:kept"].all() and two[0][f"{name}1:kept"].all()
        assert not two[0][f"{name}0:kept"][1].any() and not two[1][f"{name}1:kept"][share - 1].any()
