"""Drives contender workers (benchmarks/peers/step_worker.py) in lock step.

Every worker is started first (imports and set-up overlap, untimed); then step i runs in
each worker in turn, one process at a time, before step i + 1 runs in any. The order
within a step rotates, so no contender always follows the same neighbour. Contenders thus
never compete for the two cores, and a burst of outside load lands on all of them alike:
a per-step ratio stays meaningful on a noisy machine.
"""

from __future__ import annotations

import json
import queue
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from benchmarks.peers.step_worker import MARKER, StepConfig, summarize_steps

STARTUP_TIMEOUT_S = 600
STEP_TIMEOUT_S = 300


class WorkerFailed(Exception):
    """A worker died, timed out or answered out of protocol."""


class Worker:
    """One contender process; `request` sends a command and returns its JSON answer."""

    def __init__(self, name: str, command: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.name = name
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by close()
        self._process = subprocess.Popen(
            command, cwd=cwd, env=env, text=True, bufsize=1,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        # A thread, not select(): the text wrapper may buffer several lines at once.
        for line in self._process.stdout:
            if line.startswith(MARKER):
                self._lines.put(line[len(MARKER):])
        self._lines.put(None)

    def answer(self, timeout: float) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise WorkerFailed(f"{self.name}: no answer within {timeout:.0f} s") from None
        if line is None:
            code = self._process.wait()
            raise WorkerFailed(f"{self.name}: exited with {code}: {self._died_saying()}")
        return json.loads(line)

    def request(self, command: str, timeout: float) -> dict:
        try:
            self._process.stdin.write(command + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            raise WorkerFailed(f"{self.name}: exited: {self._died_saying()}") from None
        return self.answer(timeout)

    def _died_saying(self) -> str:
        """Last stderr line (usually the exception) first, then the tail for context."""
        self._stderr.seek(0)
        tail = self._stderr.read().strip().splitlines()[-25:] or ["(no stderr)"]
        return "\n".join([tail[-1], "stderr ends:", *tail])

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                self._process.stdin.close()
                self._process.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()
        self._stderr.close()


def run_lockstep(
    commands: dict[str, list[str]],
    config: StepConfig,
    cwd: Path,
    env: dict[str, str],
    log: Callable[[str], None],
) -> dict[str, dict]:
    """Runs every worker's warm-up and timed steps in lock step; figures per contender.

    A contender that cannot run (or fails midway) gets {'unavailable': why} instead.
    """
    results: dict[str, dict] = {}
    workers = {name: Worker(name, command, cwd, env) for name, command in commands.items()}
    try:
        info = _await_ready(workers, results, log)
        records: dict[str, list[dict]] = {name: [] for name in workers}
        for step in range(config.warmup_steps + config.steps if workers else 0):
            for name in _rotated(list(workers), step):
                try:
                    records[name].append(workers[name].request(f"step {step}", STEP_TIMEOUT_S))
                except WorkerFailed as exc:
                    _drop(name, f"failed at step {step}: {exc}", workers, results, log)
            log(f"step {step}: " + ", ".join(
                f"{n} {records[n][-1]['seconds']:.3f}s" for n in workers if records[n]))
        for name, worker in list(workers.items()):
            try:
                final = worker.request("finish", STEP_TIMEOUT_S)
            except WorkerFailed as exc:
                _drop(name, f"failed at finish: {exc}", workers, results, log)
                continue
            results[name] = {**info[name], **summarize_steps(config, records[name],
                                                             final["table_size"])}
    finally:
        for worker in workers.values():
            worker.close()
    return {name: results[name] for name in commands}


def _rotated(names: list[str], by: int) -> list[str]:
    if not names:
        return []
    by %= len(names)
    return names[by:] + names[:by]


def _await_ready(workers: dict[str, Worker], results: dict[str, dict],
                 log: Callable[[str], None]) -> dict[str, dict]:
    info = {}
    for name, worker in list(workers.items()):
        try:
            hello = worker.answer(STARTUP_TIMEOUT_S)
        except WorkerFailed as exc:
            _drop(name, f"did not start: {exc}", workers, results, log)
            continue
        if hello.get("kind") != "ready":
            _drop(name, hello.get("unavailable", f"unexpected {hello}"), workers, results, log)
            continue
        info[name] = {k: v for k, v in hello.items() if k not in ("kind", "contender")}
        log(f"{name} ready {info[name]}")
    return info


def _drop(name: str, why: str, workers: dict[str, Worker], results: dict[str, dict],
          log: Callable[[str], None]) -> None:
    log(f"{name} NOT MEASURED: {why}")
    results[name] = {"unavailable": why.splitlines()[0]}
    workers.pop(name).close()
