"""``gmeta train --np N``: runs the ranks under ``horovodrun`` and returns their status.

``horovodrun`` itself exits 1 with a traceback of its own whenever a rank fails, whatever
the rank said. Here every rank that stops on bad input (status 2) writes its status and
message to a directory the launcher made (``GMETA_STATUS_DIR``); the launcher passes the
ranks' output through as it comes, and at the end prints the ranks' message once and
exits with their status. Its own traceback is shown only when no rank reported a status
(a crash, a kill, a launcher problem).

The ranks are started by Horovod's own launcher (``horovod.runner.launch``, what
``horovodrun`` runs) through ``python -m gmeta_tf.launcher``, which differs from
``horovodrun`` in one way: before every launch ``horovodrun`` asks whether its TensorFlow
extension was built with MPI and then with Gloo, and each answer forks a process that
imports TensorFlow (about 2.5 s apiece on 2 cores, 5 of the 8 s a two-rank run took to
reach its ranks). Those answers depend only on the built extension, so they are kept per
build (its path, size and time, and Horovod's version) under ``~/.cache/gmeta`` and read
back (``horovod_build``); a rebuilt Horovod is probed again.

Example::

    gmeta train --np 2 --config pipelines/mine.yaml --fresh
    # = horovodrun -np 2 -H localhost:2 python -m gmeta_tf.cli train --config ... --fresh
    # = python -m gmeta_tf.launcher -np 2 -H localhost:2 python -m gmeta_tf.cli train ...
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from gmeta_tf import interrupts

STATUS_DIR_ENV = "GMETA_STATUS_DIR"
_RANK_ENVS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def horovodrun() -> list[str]:
    """The command that launches ranks as ``horovodrun`` does (takes its options), its build
    probes answered from their cache: this module run by this Python."""
    return [sys.executable, "-m", "gmeta_tf.launcher"]


def _build_cache_path() -> Path | None:
    try:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    except RuntimeError:  # no home directory: probed every time
        return None
    return Path(base, "gmeta", "horovod-build.json")


def horovod_build() -> dict[str, bool] | None:
    """Whether this Horovod's TensorFlow extension was built with Gloo and with MPI
    (``{"gloo": ..., "mpi": ...}``), as ``horovodrun``'s probes answer; probed once per
    build of the extension and cached. None when the extension is missing or a probe
    gives no answer (``horovodrun`` then probes, and says what is wrong, itself)."""
    import importlib.util

    import horovod
    from horovod.common import util

    spec = importlib.util.find_spec("horovod.tensorflow")
    if spec is None or spec.origin is None:
        return None
    extension = Path(util.get_extension_full_path(spec.origin, "mpi_lib"))
    try:
        stat = extension.stat()
    except OSError:
        return None
    key = {"extension": str(extension), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
           "horovod": horovod.__version__}
    path = _build_cache_path()
    try:
        cached = json.loads(path.read_text()) if path is not None else {}
        if cached.get("key") == key:
            return {"gloo": bool(cached["gloo"]), "mpi": bool(cached["mpi"])}
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        pass
    gloo, mpi = util.gloo_built(), util.mpi_built()  # each imports TensorFlow in a fork
    if gloo is None or mpi is None:
        return None
    built = {"gloo": bool(gloo), "mpi": bool(mpi)}
    if path is None:
        return built
    try:
        from gmeta_tf.atomic_file import write_text_atomically

        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps({"key": key, **built}))
    except OSError:  # a read-only home: probed again next time
        pass
    return built


def main(argv: Sequence[str] | None = None) -> int:
    """``horovodrun`` with these arguments, its build probes answered by ``horovod_build``."""
    from horovod.runner import launch

    built = horovod_build()
    if built is not None:
        launch.gloo_built = lambda verbose=False: built["gloo"]
        launch.mpi_built = lambda verbose=False: built["mpi"]
    sys.argv = ["horovodrun", *(sys.argv[1:] if argv is None else argv)]
    return launch.run_commandline() or 0


def record_status(status: int, message: str) -> None:
    """In a rank launched by ``run_ranks``: records why it stops (a no-op elsewhere)."""
    directory = os.environ.get(STATUS_DIR_ENV)
    if not directory:
        return
    rank = next((os.environ[e] for e in _RANK_ENVS if e in os.environ), "0")
    path = Path(directory, f"rank{rank}.json")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rank": int(rank), "status": status, "message": message}))
    os.replace(tmp, path)


def run_ranks(argv: Sequence[str], np_: int, hosts: str | None = None,
              extra: Sequence[str] = ()) -> int:
    """Runs ``gmeta <argv>`` as ``np_`` ranks; returns the ranks' exit status.

    Args:
        argv: The gmeta arguments of every rank (e.g. ``["train", "--config", "x.yaml"]``).
        np_: Number of ranks.
        hosts: ``horovodrun -H`` (default ``localhost:np_``).
        extra: More ``horovodrun`` options (e.g. ``--network-interface eth0``).
    """
    import importlib.util

    if importlib.util.find_spec("horovod") is None:
        raise SystemExit(f"gmeta: error: {np_} ranks need Horovod, which this Python "
                         f"({sys.executable}) lacks: run scripts/setup.sh, which builds it")
    status_dir = tempfile.mkdtemp(prefix="gmeta-ranks-")
    command = [*horovodrun(), "-np", str(np_), "-H", hosts or f"localhost:{np_}", *extra,
               sys.executable, "-m", "gmeta_tf.cli", *argv]
    env = dict(os.environ, **{STATUS_DIR_ENV: status_dir})
    try:
        with interrupts.handled():  # SIGTERM as Ctrl-C: _pass_through stops the ranks
            launcher_lines, code, held = _pass_through(command, env)
        statuses = _statuses(status_dir)
    finally:
        shutil.rmtree(status_dir, ignore_errors=True)
    failed = [s for s in statuses if s["status"] != 0]
    if failed:
        worst = max(s["status"] for s in failed)
        messages = list(dict.fromkeys(s["message"] for s in sorted(failed, key=lambda s: s["rank"])
                                      if s["status"] == worst))
        for message in messages:
            print(f"gmeta: error: {message}", file=sys.stderr)
        return worst
    sys.stderr.writelines(held)  # no rank said why: every line may help
    if code != 0:
        sys.stderr.writelines(launcher_lines)
        print(f"gmeta: error: horovodrun exited with status {code} and no rank reported why "
              f"(see the output above)", file=sys.stderr)
    return code


#: Lines held back while the ranks run and shown only when no rank reports why it stopped:
#: a rank's own error line (the launcher prints the ranks' message once, at the end) and
#: horovodrun's account of the ranks it stopped after one failed.
_HELD_LINES = re.compile(r"^(\[\d+\]<std(err|out)>:gmeta: error: |\[\d+\]<stderr>:Terminated$"
                         r"|Process \d+ exit with status code \d+\.$"
                         r"|Terminating remaining workers after failure of Process \d+\.$)")


#: A rank's last line as it stops on a signal ("gmeta: terminated ...").
_RANK_GMETA_LINE = re.compile(r"^\[\d+\]<std(err|out)>:gmeta: ")


class _RankLines:
    """horovodrun's output, line by line: the ranks' lines printed as they come, but for
    its own trailing traceback (``trailing``) and the lines of ``_HELD_LINES`` (``held``),
    both kept back. Once the ranks are told to stop (``stopping``), each rank's own last
    line ("gmeta: terminated ...") is kept back too: the launcher prints its own."""

    def __init__(self) -> None:
        self.trailing: list[str] = []
        self.held: list[str] = []
        self.stopping = False

    def take(self, line: str) -> None:
        if self.trailing or line.startswith("Traceback (most recent call last)"):
            self.trailing.append(line)
        elif _HELD_LINES.match(line) or (self.stopping and _RANK_GMETA_LINE.match(line)):
            self.held.append(line)
        else:
            sys.stdout.write(line)
            sys.stdout.flush()


def _pass_through(command: list[str], env: dict) -> tuple[list[str], int, list[str]]:
    """Runs the launcher, printing the ranks' lines as they come; returns the launcher's
    own trailing traceback lines (held back), its exit code, and the lines of
    ``_HELD_LINES`` (held back)."""
    lines = _RankLines()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.take(line)
        return lines.trailing, proc.wait(), lines.held
    finally:  # interrupted (Ctrl-C, a kill): the ranks do not outlive the launcher
        if proc.poll() is None:
            _stop_ranks_gracefully(proc, lines)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


#: How long the ranks of this host get to stop by themselves after a signal (every rank
#: after the same step, with a checkpoint: ``training.stop_vote``) before ``horovodrun``
#: is stopped, which gives them its own 5 s before it kills them.
RANKS_STOP_SECONDS = 120


def _stop_ranks_gracefully(proc: subprocess.Popen, lines: _RankLines) -> None:
    """Passes the signal the launcher received (SIGINT for Ctrl-C, else SIGTERM) to the
    ranks it started on this host and waits up to ``RANKS_STOP_SECONDS`` for
    ``horovodrun`` to end, printing the ranks' lines meanwhile. Ranks on other hosts stop
    with them: the ranks vote on stopping, and one rank's signal stops every rank. A
    second signal ends the wait at once. With no rank on this host there is no wait.
    """
    import threading

    import psutil  # Horovod's own dependency

    signum = interrupts.signal_of(interrupts.received() or interrupts.Terminated)
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        return
    signalled = 0
    for child in children:
        try:  # a rank's Python on this host (not the ssh to another host's)
            if "python" in child.name() and any(e in child.environ() for e in _RANK_ENVS):
                child.send_signal(signum)
                signalled += 1
        except psutil.Error:  # gone, or not ours to read
            pass
    if not signalled:  # no rank here: horovodrun stops those elsewhere
        return

    def drain() -> None:  # the pipe must not fill while the ranks write their stop lines
        assert proc.stdout is not None
        lines.stopping = True
        for line in proc.stdout:
            lines.take(line)

    threading.Thread(target=drain, daemon=True).start()
    try:
        proc.wait(timeout=RANKS_STOP_SECONDS)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        pass


def _statuses(directory: str) -> list[dict]:
    out = []
    for path in sorted(Path(directory).glob("rank*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


if __name__ == "__main__":
    sys.exit(main())
