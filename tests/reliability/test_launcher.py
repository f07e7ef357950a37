"""``gmeta_tf.launcher``: Horovod's launcher with its build probes answered from a cache.
The cached answers are the probes' own, taken again when Horovod's extension changes, and
the launcher starts real ranks that see each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from horovod.common import util

from gmeta_tf import launcher
from tests.multiprocess import PROJECT_ROOT


@pytest.fixture()
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def _no_probe(verbose=False):
    raise AssertionError("probed although the answer was cached")


def test_the_cached_answers_are_the_probes_and_are_read_back_without_probing(cache_home,
                                                                            monkeypatch):
    built = launcher.horovod_build()
    assert built == {"gloo": bool(util.gloo_built()), "mpi": bool(util.mpi_built())}
    assert built["gloo"], "scripts/setup.sh builds Horovod with Gloo"
    cached = json.loads((cache_home / "gmeta" / "horovod-build.json").read_text())
    assert cached["key"]["extension"].endswith(util.get_ext_suffix())
    monkeypatch.setattr(util, "gloo_built", _no_probe)
    monkeypatch.setattr(util, "mpi_built", _no_probe)
    assert launcher.horovod_build() == built


def test_another_build_or_a_damaged_cache_is_probed_again(cache_home, monkeypatch):
    path = cache_home / "gmeta" / "horovod-build.json"
    calls = []

    def probe(answer):
        def answered(verbose=False):
            calls.append(answer)
            return answer
        return answered

    monkeypatch.setattr(util, "gloo_built", probe(True))
    monkeypatch.setattr(util, "mpi_built", probe(False))
    assert launcher.horovod_build() == {"gloo": True, "mpi": False} and len(calls) == 2
    record = json.loads(path.read_text())
    record["key"]["mtime_ns"] -= 1  # the extension rebuilt since
    record["gloo"] = False
    path.write_text(json.dumps(record))
    assert launcher.horovod_build() == {"gloo": True, "mpi": False} and len(calls) == 4
    path.write_text('{"key": ')  # cut short
    assert launcher.horovod_build() == {"gloo": True, "mpi": False} and len(calls) == 6
    assert launcher.horovod_build() == {"gloo": True, "mpi": False} and len(calls) == 6


def test_no_answer_is_cached_when_a_probe_gives_none(cache_home, monkeypatch):
    monkeypatch.setattr(util, "gloo_built", lambda verbose=False: None)
    monkeypatch.setattr(util, "mpi_built", lambda verbose=False: None)
    assert launcher.horovod_build() is None
    assert not (cache_home / "gmeta" / "horovod-build.json").exists()


def test_a_cache_that_cannot_be_written_is_probed_every_time(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # no directory can go there
    calls = []
    monkeypatch.setattr(util, "gloo_built", lambda verbose=False: calls.append(1) or True)
    monkeypatch.setattr(util, "mpi_built", lambda verbose=False: False)
    for count in (1, 2):
        assert launcher.horovod_build() == {"gloo": True, "mpi": False}
        assert len(calls) == count


@pytest.mark.horovod
def test_the_launcher_starts_ranks_that_reduce_together(cache_home):
    program = ("import horovod.tensorflow as hvd, tensorflow as tf; hvd.init(); "
               "print('sum', hvd.rank(), int(hvd.allreduce(tf.constant(hvd.rank() + 1), "
               "op=hvd.Sum)), hvd.size())")
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home), TF_CPP_MIN_LOG_LEVEL="3")
    for _ in range(2):  # probed, then read back
        result = subprocess.run([*launcher.horovodrun(), "-np", "2", "-H", "localhost:2",
                                 sys.executable, "-c", program], cwd=PROJECT_ROOT, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        lines = sorted(line.split(":", 1)[1] for line in result.stdout.splitlines()
                       if "sum " in line)
        assert lines == ["sum 0 3 2", "sum 1 3 2"], result.stdout
    assert (cache_home / "gmeta" / "horovod-build.json").exists()


def test_the_ranks_lines_are_shown_but_for_horovodruns_account_and_traceback(capsys):
    lines = launcher._RankLines()
    for line in ["[0]<stdout>:step 10 loss 0.5\n", "[1]<stderr>:gmeta: error: no file x\n",
                 "Process 1 exit with status code 2.\n", "[0]<stdout>:step 20 loss 0.4\n",
                 "[0]<stderr>:gmeta: interrupted: the checkpoint is kept\n"]:
        lines.take(line)
    lines.stopping = True  # told to stop: each rank's own last line is the launcher's to say
    for line in ["[1]<stderr>:gmeta: terminated (SIGTERM): kept\n", "[1]<stdout>:saved\n",
                 "Traceback (most recent call last):\n", "[0]<stdout>:after it\n"]:
        lines.take(line)
    assert capsys.readouterr().out == (
        "[0]<stdout>:step 10 loss 0.5\n[0]<stdout>:step 20 loss 0.4\n"
        "[0]<stderr>:gmeta: interrupted: the checkpoint is kept\n[1]<stdout>:saved\n")
    assert lines.held == ["[1]<stderr>:gmeta: error: no file x\n",
                          "Process 1 exit with status code 2.\n",
                          "[1]<stderr>:gmeta: terminated (SIGTERM): kept\n"]
    assert lines.trailing == ["Traceback (most recent call last):\n", "[0]<stdout>:after it\n"]
