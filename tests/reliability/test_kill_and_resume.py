"""A rank SIGKILLed mid-training brings the job down without a hang; ``gmeta train
--resume`` walks back past a damaged checkpoint and ends with the very weights of an
uninterrupted run (real ``horovodrun -np 2``, real signal). SIGTERM to one rank alone
stops every rank after the same step, with a checkpoint of that step to resume from. A
run killed while pruning its old checkpoints leaves no half checkpoint behind and resumes
from what is left."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from gmeta_tf import checkpoint, launcher
from gmeta_tf.cli import main
from tests.reliability.launch import GLOO_TIMEOUT_SECONDS, Job, horovodrun, wait_for
from tests.reliability.prune_kill_worker import KILLED_WHILE_DELETING
from tests.reliability.weights import assert_same_weights

STEPS, EVERY = 60, 10


def gmeta_train(config: Path, run_dir: Path, *flags: str) -> list[str]:
    return horovodrun([sys.executable, "-m", "gmeta_tf.cli", *train_args(config, run_dir),
                       *flags])


def train_args(config: Path, run_dir: Path, steps: int = STEPS, *sets: str) -> list[str]:
    return ["train", "--config", str(config), "--set", f"run_dir={run_dir}",
            "--set", f"train.steps={steps}", "--set", f"train.checkpoint_every={EVERY}",
            *[a for s in sets for a in ("--set", s)]]


@pytest.mark.horovod
def test_sigkill_of_one_rank_then_resume_ends_with_uninterrupted_weights(tiny_pipeline,
                                                                        tmp_path):
    reference = tmp_path / "reference"
    Job(gmeta_train(tiny_pipeline, reference, "--fresh"),
        tmp_path / "reference.log").run_to_end(timeout=400)

    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    job = Job(gmeta_train(tiny_pipeline, run, "--fresh"), tmp_path / "killed.log")
    wait_for(lambda: (ckpts / f"ckpt-{2 * EVERY}" / checkpoint.MANIFEST).exists(), 300,
             f"checkpoint ckpt-{2 * EVERY} of the run to be killed")
    victim = job.rank_pid(1)
    assert victim is not None, "rank 1 not found"
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    code = job.wait(timeout=GLOO_TIMEOUT_SECONDS + 60)  # raises if the survivor hangs
    assert code != 0, f"the job ignored the death of rank 1:\n{job.output()[-3000:]}"
    assert time.monotonic() - killed_at < GLOO_TIMEOUT_SECONDS + 60
    wait_for(lambda: not job.alive_ranks(), 30, "every process of the killed job to exit")
    assert "Exit code: 137" in job.output() or "-9" in job.output(), job.output()[-3000:]
    done = checkpoint.complete_checkpoints(ckpts)
    assert done and done[-1].name != f"ckpt-{STEPS}", "the kill came after the run ended"

    # Damage the newest complete checkpoint: resume must notice and take the one before.
    newest = done[-1]
    shard = sorted((newest / "shards").glob("*.npz"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    output = Job(gmeta_train(tiny_pipeline, run, "--resume"),
                 tmp_path / "resumed.log").run_to_end(timeout=400)
    assert f"skipping checkpoint {newest}" in output and "is damaged" in output, output[-3000:]
    assert f"resumed from {done[-2]}" in output, output[-3000:]
    assert_same_weights(reference / "checkpoints" / f"ckpt-{STEPS}", ckpts / f"ckpt-{STEPS}")


@pytest.mark.horovod
def test_sigterm_to_one_rank_stops_every_rank_after_one_step_with_its_checkpoint(
        tiny_pipeline, tmp_path):
    """A scheduler pre-empting one host signals its ranks alone: rank 1 votes to stop, the
    vote rides in the next step's all-reduce, and both ranks stop after that step, write
    its checkpoint together (no periodic checkpoint in this run) and exit without a hang;
    ``--resume`` from it ends with the weights of an uninterrupted run."""
    run, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    no_periodic = ("train.checkpoint_every=0", "train.eval_every=0", "train.log_every=5")
    job = Job(horovodrun([sys.executable, "-m", "gmeta_tf.cli",
                          *train_args(tiny_pipeline, run, 100000, *no_periodic), "--fresh"]),
              tmp_path / "stopped.log")
    wait_for(lambda: "] step 15/" in job.output(), 300, "rank 0 to report step 15")
    victim = job.rank_pid(1)
    assert victim is not None, "rank 1 not found"
    os.kill(victim, signal.SIGTERM)
    code = job.wait(timeout=GLOO_TIMEOUT_SECONDS + 60)  # raises if a rank hangs
    output = job.output()
    assert code != 0, output[-4000:]
    stopped = re.findall(r"\[rank (\d)/2\].*stopped by (SIGTERM|a signal to another rank) "
                         r"after step (\d+) on every rank: checkpoint (\S+) written", output)
    assert sorted((r, how) for r, how, _, _ in stopped) == [
        ("0", "a signal to another rank"), ("1", "SIGTERM")], output[-4000:]
    (step,) = {int(s) for _, _, s, _ in stopped}  # the same step on both ranks
    assert step >= 15 and "<stderr>:Traceback" not in output, output[-4000:]  # no rank's
    assert "[1]<stderr>:gmeta: terminated (SIGTERM): every complete checkpoint is kept" in output
    assert [d.name for d in checkpoint.complete_checkpoints(ckpts)] == [f"ckpt-{step}"]
    manifest = checkpoint.verify(ckpts / f"ckpt-{step}")
    assert manifest["world_size"] == 2 and manifest["step"] == step, manifest

    end = step + 5
    reference = tmp_path / "reference"

    def to_end(run_dir: Path, flag: str) -> list[str]:
        return horovodrun([sys.executable, "-m", "gmeta_tf.cli",
                           *train_args(tiny_pipeline, run_dir, end, *no_periodic), flag])

    Job(to_end(reference, "--fresh"), tmp_path / "reference.log").run_to_end(timeout=400)
    output = Job(to_end(run, "--resume"), tmp_path / "resumed.log").run_to_end(timeout=400)
    assert f"resumed from {ckpts / f'ckpt-{step}'}" in output, output[-3000:]
    assert_same_weights(reference / "checkpoints" / f"ckpt-{end}", ckpts / f"ckpt-{end}")


@pytest.mark.horovod
def test_sigterm_to_gmeta_train_np_2_reaches_its_ranks_which_stop_with_a_checkpoint(
        tiny_pipeline, tmp_path):
    """`gmeta train --np 2` pre-empted (SIGTERM to the command a user ran): the launcher
    passes the signal to its ranks and waits for them, rather than stopping `horovodrun`
    at once (which gives ranks 5 s); they stop after one step with its checkpoint."""
    run, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    sets = ("train.checkpoint_every=0", "train.eval_every=0", "train.log_every=5")
    job = Job([sys.executable, "-m", "gmeta_tf.cli",
               *train_args(tiny_pipeline, run, 100000, *sets), "--np", "2"],
              tmp_path / "launched.log")
    wait_for(lambda: "] step 15/" in job.output(), 300, "rank 0 to report step 15")
    os.kill(job.proc.pid, signal.SIGTERM)
    assert job.wait(timeout=GLOO_TIMEOUT_SECONDS + 60) == 143, job.output()[-4000:]
    output = job.output()
    stopped = re.findall(r"\[rank (\d)/2\].*stopped by SIGTERM after step (\d+) on every "
                         r"rank: checkpoint \S+ written", output)
    assert sorted(r for r, _ in stopped) == ["0", "1"], output[-4000:]
    (step,) = {int(s) for _, s in stopped}
    assert "gmeta: terminated (SIGTERM): every complete checkpoint is kept" in output
    assert "Traceback" not in output, output[-4000:]
    assert [d.name for d in checkpoint.complete_checkpoints(ckpts)] == [f"ckpt-{step}"]


@pytest.mark.horovod
def test_sigterm_to_one_rank_of_an_elastic_run_commits_the_step_every_rank_stopped_after(
        tiny_pipeline, tmp_path):
    """`gmeta train --elastic` (2 ranks, min 1): SIGTERM to rank 1 alone stops both after
    the same step with a commit of that step, which the next run goes on from."""
    run, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    hosts, discover = tmp_path / "hosts", tmp_path / "discover_hosts.sh"
    hosts.write_text("localhost:2\n")
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    sets = ("train.checkpoint_every=1000", "train.log_every=5")
    command = [*launcher.horovodrun(), "-np", "2", "--min-np", "1", "--max-np", "2",
               "--host-discovery-script", str(discover), "--network-interface", "lo",
               "--gloo-timeout-seconds", str(GLOO_TIMEOUT_SECONDS), sys.executable, "-m",
               "gmeta_tf.cli", *train_args(tiny_pipeline, run, 100000, *sets), "--elastic"]
    job = Job(command, tmp_path / "elastic.log")
    wait_for(lambda: "] step 15/" in job.output(), 300, "rank 0 to report step 15")
    victim = job.rank_pid(1)
    assert victim is not None, "rank 1 not found"
    os.kill(victim, signal.SIGTERM)
    assert job.wait(timeout=GLOO_TIMEOUT_SECONDS + 90) != 0
    output = job.output()
    stopped = re.findall(r"\[rank (\d)/2\].*stopped after step (\d+) on every rank: commit "
                         r"(\S+) written", output)
    assert sorted(r for r, _, _ in stopped) == ["0", "1"], output[-4000:]
    (step,) = {int(s) for _, s, _ in stopped}
    assert step >= 15 and "<stderr>:Traceback" not in output, output[-4000:]
    assert [d.name for d in checkpoint.complete_checkpoints(ckpts)] == [f"ckpt-{step}"]
    assert checkpoint.verify(ckpts / f"ckpt-{step}")["step"] == step
    # each rank's last line says how an elastic run goes on: the same command, no --resume
    last_lines = re.findall(r"\[(\d)\]<stderr>:gmeta: (.*)", output)
    assert sorted(r for r, _ in last_lines) == ["0", "1"], output[-4000:]
    assert all(line.endswith(": every complete commit is kept; the same command goes on "
                             "from the newest") for _, line in last_lines), last_lines


def test_kill_while_pruning_leaves_no_half_checkpoint_and_resumes(tiny_pipeline, tmp_path):
    steps, keep = 3 * EVERY, "train.keep_checkpoints=1"
    no_validation = "train.eval_every=0"  # no best checkpoint to protect from pruning
    reference = tmp_path / "reference"
    assert main([*train_args(tiny_pipeline, reference, steps, keep, no_validation),
                 "--fresh"]) == 0

    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    killed = Job([sys.executable, "-m", "tests.reliability.prune_kill_worker",
                  *train_args(tiny_pipeline, run, steps, keep, no_validation), "--fresh"],
                 tmp_path / "killed.log")
    assert killed.wait(timeout=400) == -signal.SIGKILL, killed.output()[-3000:]
    # Killed while pruning ckpt-10 after ckpt-20 was complete (keep 1).
    assert f"{KILLED_WHILE_DELETING} " in killed.output(), killed.output()[-3000:]
    assert [d.name for d in checkpoint.complete_checkpoints(ckpts)] == [f"ckpt-{2 * EVERY}"]
    for directory in ckpts.glob("ckpt-*"):  # nothing left that looks like a checkpoint is torn
        checkpoint.verify(directory)
    assert list(ckpts.glob(".deleting-*")), "the kill came before the deletion began"

    assert main([*train_args(tiny_pipeline, run, steps, keep, no_validation),
                 "--resume"]) == 0
    assert sorted(p.name for p in ckpts.iterdir()) == [f"ckpt-{steps}"]  # leftover cleared
    assert_same_weights(reference / "checkpoints" / f"ckpt-{steps}", ckpts / f"ckpt-{steps}")
