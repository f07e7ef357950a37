"""Real processes for the reliability tests: horovodrun jobs started in their own
session (so a test can always clean up what it started), their ranks found by the
``HOROVOD_RANK`` in their environment, and signals sent to one rank by its pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from gmeta_tf import launcher

PROJECT_ROOT = Path(__file__).resolve().parents[2]
HOROVODRUN = Path(sys.executable).with_name("horovodrun")
# Collectives give up after this long when a peer is gone (Gloo's default is 30 minutes).
GLOO_TIMEOUT_SECONDS = 30


def environment(**extra: str) -> dict[str, str]:
    """The environment of every launched process (legacy Keras, quiet TF, the project)."""
    return dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
                PYTHONPATH=str(PROJECT_ROOT), PYTHONUNBUFFERED="1",
                HOROVOD_GLOO_TIMEOUT_SECONDS=str(GLOO_TIMEOUT_SECONDS), **extra)


def horovodrun(command: Sequence[str], np_: int = 2) -> list[str]:
    """``horovodrun -np N -H localhost:N`` around command (a plain command when N is 1), as
    ``gmeta train --np N`` runs it (``gmeta_tf.launcher``)."""
    if np_ == 1:
        return list(command)
    return [*launcher.horovodrun(), "-np", str(np_), "-H", f"localhost:{np_}",
            "--gloo-timeout-seconds", str(GLOO_TIMEOUT_SECONDS), *command]


class Job:
    """A launched process tree whose output goes to a log file.

    Args:
        command: The command line.
        log_path: Where stdout and stderr go.
        cwd: The working directory.
    """

    def __init__(self, command: Sequence[str], log_path: Path, cwd: Path = PROJECT_ROOT,
                 env: dict[str, str] | None = None) -> None:
        self.command = list(command)
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(self.command, cwd=cwd, env=env or environment(),
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """The exit code; on timeout the whole tree is killed and AssertionError raised."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_tree()
            raise AssertionError(f"{' '.join(self.command)} still running after {timeout:.0f}s "
                                 f"(hung?); output:\n{self.output()[-4000:]}") from None
        finally:
            self._log.flush()

    def rank_pid(self, rank: int) -> int | None:
        """The pid of the process running rank ``rank`` of this job, if it is up."""
        for pid in descendants(self.proc.pid):
            env = _environ(pid)
            if env.get("HOROVOD_RANK") == str(rank) and "python" in _exe(pid):
                return pid
        return None

    def alive_ranks(self) -> list[int]:
        """Pids of the job's processes that are still alive (zombies excluded)."""
        return [pid for pid in descendants(self.proc.pid) if _state(pid) not in ("Z", "")]

    def kill_tree(self) -> None:
        """SIGKILL to the job's own session (it was started with start_new_session)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self._log.close()

    def run_to_end(self, timeout: float) -> str:
        """Waits for the job; its output, or AssertionError with it when it failed."""
        code = self.wait(timeout)
        self._log.close()
        if code != 0:
            raise AssertionError(f"{' '.join(self.command)} exited {code}:\n"
                                 f"{self.output()[-6000:]}")
        return self.output()


def wait_for(condition: Callable[[], object], timeout: float, what: str,
             interval: float = 0.02) -> object:
    """Polls condition until it returns something true; AssertionError after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def descendants(root: int) -> list[int]:
    """All processes below root (by parent pid, read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _exe(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (OSError, IndexError):
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
