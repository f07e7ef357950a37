"""The one atomic write every small file of a run goes through (BEST.json, tuned.yaml,
config.yaml, train_summary.json, a checkpoint's manifest, eval results): a write that fails
part-way leaves the file as it was and no temporary file beside it."""

from __future__ import annotations

import pytest

from gmeta_tf.atomic_file import write_atomically, write_text_atomically


def test_a_text_write_replaces_the_file_and_leaves_nothing_beside_it(tmp_path):
    path = tmp_path / "BEST.json"
    path.write_text("old")
    write_text_atomically(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["BEST.json"]


def test_a_write_that_fails_part_way_leaves_the_old_file(tmp_path):
    path = tmp_path / "tuned.yaml"
    path.write_text("chosen: old\n")

    def half_then_crash(tmp):
        tmp.write_text("chosen: ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, half_then_crash)
    assert path.read_text() == "chosen: old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["tuned.yaml"]


def test_a_first_write_that_fails_leaves_no_file(tmp_path):
    def crash(tmp):
        tmp.write_text("{")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomically(tmp_path / "train_summary.json", crash)
    assert list(tmp_path.iterdir()) == []


def test_a_staged_directory_replaces_its_target_whole_with_a_new_directorys_mode(tmp_path):
    """A directory staged beside its target (``staging_dir``) is moved into place by
    ``replace_dir``, what was there removed only after; it gets the mode a new directory
    gets under the umask (a model server running as another user reads an export), not
    mkdtemp's 0700; a check that refuses the old one leaves everything as it was."""
    import os

    from gmeta_tf.atomic_file import replace_dir, staging_dir

    target = tmp_path / "export" / "8"
    target.mkdir(parents=True)
    (target / "old.pb").write_text("old")
    staged = staging_dir(target)
    (tmp_path / "export" / os.path.basename(staged) / "new.pb").write_text("new")

    def refuse(old):
        raise ValueError(f"not ours: {old}")

    with pytest.raises(ValueError, match="not ours"):
        replace_dir(staged, target, refuse)
    assert (target / "old.pb").read_text() == "old" and os.path.isdir(staged)
    replace_dir(staged, target, lambda old: None)
    assert [p.name for p in target.iterdir()] == ["new.pb"]
    assert [p.name for p in target.parent.iterdir()] == ["8"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask


def test_a_target_through_a_link_and_dotdot_is_staged_where_the_rename_lands(tmp_path):
    """``link/../out`` is where the file system puts it (beside the link's target), not
    where ``os.path.abspath`` reads it (beside the link): the staging directory, the
    replace and the next write's tidying all look there."""
    import os
    import socket
    import subprocess

    from gmeta_tf.atomic_file import replace_dir, staging_dir, tidy_staging

    (tmp_path / "real" / "inner").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "inner")
    target = tmp_path / "link" / ".." / "out"
    staged = staging_dir(target)
    assert os.path.dirname(staged) == str(tmp_path / "real")
    (tmp_path / "real" / os.path.basename(staged) / "f").write_text("new")
    replace_dir(staged, target)
    assert (tmp_path / "real" / "out" / "f").read_text() == "new"
    assert not (tmp_path / "out").exists()
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = tmp_path / "real" / f".out.tmp-{gone.pid}@{socket.gethostname()}.z9"
    left.mkdir()
    tidy_staging(target, "a conversion")
    assert not left.exists()
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["inner", "out"]


def test_a_target_with_a_trailing_separator_is_staged_beside_it(tmp_path):
    """``out/`` is ``out``: staged beside it, not inside it."""
    import os

    from gmeta_tf.atomic_file import physical_path, replace_dir, staging_dir

    staged = staging_dir(f"{tmp_path / 'out'}/")
    assert os.path.dirname(staged) == str(tmp_path)
    assert physical_path(f"{tmp_path}/out/") == str(tmp_path / "out")
    replace_dir(staged, f"{tmp_path / 'out'}/")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_conversion_through_a_link_and_dotdot_lands_where_the_file_system_puts_it(tmp_path):
    """The dataset writer reads its output path as the file system does: ``link/../data``
    beside the link's target, where a later reader of that path finds it."""
    from gmeta_tf import data

    (tmp_path / "real" / "inner").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "inner")
    src = tmp_path / "in.csv"
    src.write_text("user_id,item_id,label\n" + "\n".join(
        f"{u},{i},{(u + i) % 2}" for u in range(1, 6) for i in range(20)) + "\n")
    out = tmp_path / "link" / ".." / "data"
    data.convert_csv(str(src), str(out),
                     {"task": "user_id", "label": "label", "sparse": ["item_id"]},
                     split=data.SplitConfig(query_size=3, min_rows=5))
    assert (tmp_path / "real" / "data" / "manifest.json").exists()
    assert not (tmp_path / "data").exists()
    assert data.Manifest.load(str(out)).files


_STAGING_WRITER = """
import sys
from gmeta_tf.atomic_file import staging_dir
staged = staging_dir(sys.argv[1])
open(staged + "/part", "w").write("half")
print(staged, flush=True)
sys.stdin.read()  # runs until killed
"""


def _free_pid() -> int:
    """A process id no process of this namespace has, from the top of the range."""
    from gmeta_tf.atomic_file import _running

    with open("/proc/sys/kernel/pid_max") as f:
        top = int(f.read()) - 1
    return next(p for p in range(top, 300, -1) if not _running(p))


def test_a_write_in_another_process_id_namespace_is_left_while_it_runs(tmp_path):
    """A writer in a container that shares this host name but not its process ids (run here
    for real under ``unshare --pid``) names its staging directory after an id that is no
    process of this namespace: its lock, not its id, says it runs. Tidying leaves it while
    it runs, and clears it and its lock file once it is killed."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    from gmeta_tf.atomic_file import _running, tidy_staging

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a process-id namespace needs root and unshare")
    pid = _free_pid()
    target = tmp_path / "out"
    # the namespace's next process gets id pid: the writer's id there, no process's here
    writer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
         f'echo {pid - 1} > /proc/sys/kernel/ns_last_pid && "$0" -c "$1" "$2"',
         sys.executable, _STAGING_WRITER, str(target)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        staged = writer.stdout.readline().strip()
        assert staged, "the writer printed no staging directory"
        assert os.path.basename(staged).startswith(f".out.tmp-{pid}@")
        assert not _running(pid)  # read by its id alone, it would be taken as killed
        tidy_staging(target, "a conversion")
        assert os.path.isdir(staged) and os.path.exists(staged + ".lock")
    finally:
        os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
    # the namespace's processes die with its first; the kernel lets the lock go as the
    # writer's files close
    for _ in range(100):
        tidy_staging(target, "a conversion")
        if not os.path.exists(staged):
            break
        time.sleep(0.05)
    assert list(tmp_path.iterdir()) == []


def test_a_lock_file_left_by_a_write_killed_after_its_move_is_removed(tmp_path):
    """A write killed after its staging directory moved into place, before it let its lock
    go, leaves only the lock file: the next write's tidying removes it, and a staged write
    that ends lets its lock go and removes its file."""
    import os
    import socket
    import subprocess

    from gmeta_tf.atomic_file import replace_dir, staging_dir, tidy_staging

    staged = staging_dir(tmp_path / "out")
    assert os.path.exists(staged + ".lock")
    replace_dir(staged, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = tmp_path / f".out.tmp-{gone.pid}@{socket.gethostname()}.k1.lock"
    orphan.write_text("")
    tidy_staging(tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
