"""``gmeta train --resume`` continues from the checkpoint to the weights of an uninterrupted
run; on another number of ranks it takes the batches an uninterrupted run at the new size
takes from the checkpoint's step on (real ``horovodrun -np 2``, 2 -> 1 and 1 -> 2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf import checkpoint
from gmeta_tf.cli import main
from gmeta_tf.training.trainer import Trainer
from tests.multiprocess import run_ranks
from tests.product import resume_worker
from tests.product.conftest import set_args, tiny_overrides


def _train(run_dir: Path, data_dir: Path, steps: int, *flags: str) -> None:
    sets = set_args(tiny_overrides(run_dir, data_dir, steps) + ["train.eval_every=0"])
    assert main(["train", *sets, *flags]) == 0


def _contents(ckpt: Path) -> dict[str, np.ndarray]:
    """Every dense variable (optimizer slots included) and every table array of a checkpoint."""
    reader = tf.train.load_checkpoint(str(ckpt / "dense"))
    out = {f"dense:{k}": reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
           if "save_counter" not in k and "OBJECT_GRAPH" not in k}
    for shard in sorted((ckpt / "shards").iterdir()):
        with np.load(shard) as data:
            out.update({f"{shard.name}:{k}": data[k] for k in data.files})
    return out


def test_resume_reaches_the_weights_of_an_uninterrupted_run(tiny_data, tmp_path):
    _train(tmp_path / "whole", tiny_data, 8, "--fresh")
    _train(tmp_path / "split", tiny_data, 4, "--fresh")
    assert checkpoint.latest(tmp_path / "split" / "checkpoints").name == "ckpt-4"
    _train(tmp_path / "split", tiny_data, 8, "--resume")

    whole = _contents(checkpoint.latest(tmp_path / "whole" / "checkpoints"))
    resumed = _contents(checkpoint.latest(tmp_path / "split" / "checkpoints"))
    assert whole.keys() == resumed.keys()
    assert any("tower" in k and "Adam" not in k for k in whole)
    for key in whole:
        np.testing.assert_array_equal(resumed[key], whole[key], err_msg=key)


def test_existing_checkpoints_need_resume_or_fresh(tiny_data, tmp_path, capsys):
    _train(tmp_path / "run", tiny_data, 4, "--fresh")
    sets = set_args(tiny_overrides(tmp_path / "run", tiny_data, 4))
    assert main(["train", *sets]) == 2
    assert "already has checkpoints (latest ckpt-4): pass --resume" in capsys.readouterr().err


def _files(ckpt: Path) -> dict[str, tuple[int, int]]:
    """Each file of a checkpoint by its inode and modification time: rewritten files differ."""
    return {str(p.relative_to(ckpt)): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(ckpt.rglob("*")) if p.is_file()}


def test_resuming_a_finished_run_leaves_its_last_checkpoint_as_written(tiny_data, tmp_path):
    """A run resumed with nothing left to train does not write its restored checkpoint
    again in place (a kill during that write would leave it, the best one perhaps, broken)."""
    _train(tmp_path / "run", tiny_data, 4, "--fresh")
    ckpt = tmp_path / "run" / "checkpoints" / "ckpt-4"
    before = _files(ckpt)
    _train(tmp_path / "run", tiny_data, 4, "--resume")
    assert _files(ckpt) == before
    assert checkpoint.latest(tmp_path / "run" / "checkpoints") == ckpt


def test_checkpoints_a_killed_fresh_run_set_aside_come_back(tiny_data, tmp_path, capfd):
    """--fresh sets the old checkpoints aside until its first checkpoint; killed before it
    (no `except` runs), the next run puts them back, and --resume continues from them."""
    _train(tmp_path / "run", tiny_data, 4, "--fresh")
    root = tmp_path / "run" / "checkpoints"
    aside = root.with_name("checkpoints.replaced-20260101T000000")
    root.rename(aside)  # what a --fresh run killed before its first checkpoint leaves
    (root / "ckpt-4").mkdir(parents=True)  # and a save it never finished
    capfd.readouterr()
    _train(tmp_path / "run", tiny_data, 8, "--resume")
    log = capfd.readouterr().err
    assert f"are back in place from {aside}" in log and "(step 4, saved by 1 ranks)" in log
    assert checkpoint.latest(root).name == "ckpt-8" and not aside.exists()


def test_a_fresh_run_keeps_the_results_of_the_checkpoints_it_replaced_apart(tiny_data,
                                                                          tmp_path, capfd):
    """``gmeta eval``'s results name a step and a checkpoint path that a ``--fresh`` run
    writes again, and TensorBoard would draw both runs' curves as one: once its first
    checkpoint replaces the old ones, the earlier results move to ``replaced-<time>/`` in
    their folders (kept), so ``eval/`` holds results of its checkpoints only."""
    run = tmp_path / "run"
    _train(run, tiny_data, 4, "--fresh")
    sets = set_args(tiny_overrides(run, tiny_data, 4) + ["train.eval_every=0"])
    assert main(["eval", *sets]) == 0
    results, events = run / "eval", run / "tensorboard"
    written = {f.name: f.read_bytes() for f in results.glob("*.json")}
    logged = {f.name for f in events.glob("events.out.tfevents.*")}
    assert written and logged, "gmeta eval wrote no result, or training no event file"
    capfd.readouterr()
    _train(run, tiny_data, 4, "--fresh")
    log = capfd.readouterr().err
    assert not list(results.glob("*.json"))
    kept, = results.glob("replaced-*")
    assert {f.name: f.read_bytes() for f in kept.glob("*.json")} == written
    assert f"the earlier run's evaluation results ({', '.join(sorted(written))}) are kept " \
           f"at {kept}" in log
    old_events, = events.glob("replaced-*")
    assert {f.name for f in old_events.iterdir()} == logged
    new_events = {f.name for f in events.glob("events.out.tfevents.*")}
    assert new_events and not new_events & logged  # this run's curves, apart


def test_a_damaged_newer_checkpoint_is_set_aside_not_kept_over_good_ones(tiny_data, tmp_path,
                                                                         capfd):
    """Resumed past a damaged newer checkpoint (complete by its manifest, a file changed
    since), a run keeping one checkpoint must not prune its own new ones in its favour: it
    is renamed out of the checkpoints' way, kept, and the run ends with a good one."""
    import json
    import shutil

    _train(tmp_path / "run", tiny_data, 4, "--fresh")
    root = tmp_path / "run" / "checkpoints"
    damaged = root / "ckpt-12"
    shutil.copytree(root / "ckpt-4", damaged)
    manifest = json.loads((damaged / checkpoint.MANIFEST).read_text())
    manifest["step"] = 12
    (damaged / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    shard = next(p for p in sorted((damaged / "shards").iterdir()))
    shard.write_bytes(shard.read_bytes()[:-8])
    capfd.readouterr()
    sets = set_args(tiny_overrides(tmp_path / "run", tiny_data, 8)
                    + ["train.eval_every=0", "train.keep_checkpoints=1"])
    assert main(["train", "--resume", *sets]) == 0
    log = capfd.readouterr().err
    assert f"the damaged checkpoint {damaged} is set aside as {root / 'damaged-ckpt-12'}" in log
    assert [d.name for d in checkpoint.complete_checkpoints(root)] == ["ckpt-8"]
    assert (root / "damaged-ckpt-12" / "shards" / shard.name).is_file()


def test_the_best_checkpoint_is_recorded_only_once_it_is_saved(tiny_data, tmp_path,
                                                                  monkeypatch):
    """BEST.json never names a step whose checkpoint was not written: a save that fails
    (a full disk, a kill) leaves the record of the best one that exists."""
    from gmeta_tf.training.selection import best_checkpoints

    saved, failed, real_save = [], [], checkpoint.save

    def save_failing_from_step_4(root, state, step, *args, **kwargs):
        if step >= 4:  # the first save after the first validation's: a new best's
            failed.append(step)
            raise OSError(28, "No space left on device")
        saved.append(step)
        return real_save(root, state, step, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save", save_failing_from_step_4)
    sets = set_args(tiny_overrides(tmp_path / "run", tiny_data, 12)
                    + ["train.eval_every=2", "train.checkpoint_every=0",
                       "train.select_metric=logloss"])
    with pytest.raises(OSError, match="No space left"):
        main(["train", "--fresh", *sets])
    assert 2 in saved and failed[0] < 12  # it failed saving a new best, not at the end
    best = best_checkpoints(tmp_path / "run" / "checkpoints")
    named = {n: b["step"] for n, b in best.items() if n != "metric"}
    assert named and set(named.values()) <= set(saved), (named, saved)
    for step in named.values():
        assert (tmp_path / "run" / "checkpoints" / f"ckpt-{step}" / "MANIFEST.json").is_file()


@pytest.mark.parametrize("flags", [["--resume", "--fresh"]])
def test_resume_and_fresh_exclude_each_other(flags):
    with pytest.raises(SystemExit):
        main(["train", *flags])


# ---- resuming on another number of ranks -----------------------------------------------

@pytest.fixture(scope="module")
def across_sizes(tiny_data, tmp_path_factory) -> Path:
    """Uninterrupted 8-step runs at 1 and 2 ranks, and runs checkpointed at step 4 on one
    size and resumed to step 8 on the other, every batch's task ids recorded per rank."""
    root = tmp_path_factory.mktemp("resume_sizes")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "_batches", resume_worker.recorded_batches)
        resume_worker.train(root, tiny_data, "whole1", 8, "fresh")
        resume_worker.train(root, tiny_data, "one_to_two", 4, "fresh")
    output = run_ranks("tests.product.resume_worker", str(root), str(tiny_data),
                       "whole2:8:fresh", "two_to_one:4:fresh", "one_to_two:8:resume", np_=2,
                       timeout=900)
    assert "(step 4, saved by 1 ranks)" in output, output[-3000:]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "_batches", resume_worker.recorded_batches)
        resume_worker.train(root, tiny_data, "two_to_one", 8, "resume")
    return root


def _assert_resumed_like_uninterrupted(root: Path, run: str, before: int, after: int) -> None:
    """Steps 1-4 of ``run`` trained on ``before`` ranks; steps 5-8 on ``after`` ranks took,
    rank by rank, the batches the uninterrupted ``after``-rank run took at those steps."""
    whole = {r: resume_worker.read_batches(root / f"whole{after}", r) for r in range(after)}
    for r in range(after):
        resumed = resume_worker.read_batches(root / run, r)
        assert sorted(resumed) == (list(range(1, 9)) if r < before else list(range(5, 9)))
        for step in range(5, 9):
            assert resumed[step] == whole[r][step], f"rank {r} step {step}"
        if r < before:
            assert {resumed[s][0] for s in range(1, 5)} == {before}
    manifest = checkpoint.read_manifest(root / run / "checkpoints" / "ckpt-8")
    assert (manifest["step"], manifest["world_size"]) == (8, after)
    # The two sizes' batch streams differ, so the comparison above can tell them apart.
    other = resume_worker.read_batches(root / f"whole{before}", 0)
    assert [other[s][1] for s in range(5, 9)] != [whole[0][s][1] for s in range(5, 9)]


@pytest.mark.horovod
def test_resume_from_two_ranks_on_one_takes_the_batches_of_a_one_rank_run(across_sizes):
    _assert_resumed_like_uninterrupted(across_sizes, "two_to_one", before=2, after=1)


@pytest.mark.horovod
def test_resume_from_one_rank_on_two_takes_the_batches_of_a_two_rank_run(across_sizes):
    _assert_resumed_like_uninterrupted(across_sizes, "one_to_two", before=1, after=2)
