"""The traps a user's own data used to fall into: each gives a clear error (status 2, the
key, file, line or column named) and loses nothing already written."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gmeta_tf import checkpoint
from gmeta_tf import data as meta_io
from gmeta_tf.cli import main
from gmeta_tf.config import ConfigError, load_config
from gmeta_tf.data.manifest import MANIFEST_NAME
from gmeta_tf.training import prepare_dataset
from tests.product.conftest import set_args, tiny_overrides
from tests.product.own_data import gmeta, write_ratings


def _sets(run_dir: Path, data_dir: Path, steps: int = 4, *more: str) -> list[str]:
    overrides = tiny_overrides(run_dir, data_dir, steps) + ["train.eval_every=0", *more]
    return set_args(overrides)


def _checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


@pytest.fixture(scope="module")
def trained_once(tiny_data, tmp_path_factory):
    """A copy of the tiny dataset and a run with checkpoints 2 and 4 trained on it."""
    root = tmp_path_factory.mktemp("traps")
    data_dir, run_dir = root / "data", root / "run"
    shutil.copytree(tiny_data, data_dir)
    assert main(["train", *_sets(run_dir, data_dir, 4, "train.checkpoint_every=2")]) == 0
    return run_dir, data_dir


@pytest.fixture()
def trained(trained_once, tmp_path):
    """This test's own copy of the trained run and its dataset (the run's config and
    checkpoints name the run directory only through the config, so a copy is a run)."""
    run_dir, data_dir = tmp_path / "run", tmp_path / "data"
    shutil.copytree(trained_once[0], run_dir)
    shutil.copytree(trained_once[1], data_dir)
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]
    return run_dir, data_dir


def test_fresh_with_a_truncated_data_file_keeps_the_checkpoints(trained, capsys):
    run_dir, data_dir = trained
    manifest = meta_io.Manifest.load(str(data_dir))
    victim = data_dir / manifest.files_of("warm")[0].path
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    assert main(["train", "--fresh", *_sets(run_dir, data_dir)]) == 2
    assert f"{victim}: file size differs from the manifest" in capsys.readouterr().err
    assert main(["data", "prepare", *_sets(run_dir, data_dir)]) == 2  # not "using it"
    err = capsys.readouterr().err
    assert f"{victim}: file size differs" in err and "prepare --overwrite" in err
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]
    checkpoint.verify(run_dir / "checkpoints" / "ckpt-4")  # intact, checksums and all
    assert sorted(p.name for p in run_dir.iterdir() if "replaced" in p.name) == []


def _damage_in_place(path: Path, start: int, stop: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[start:stop] = bytes(stop - start)
    path.write_bytes(bytes(raw))


def test_a_data_file_damaged_in_place_is_named_with_how_to_make_it_again(trained, capsys):
    """A data file whose bytes changed but not its size: every rank checks its share's
    SHA-256 before training or evaluation (``data.verify: checksum``, the default), so
    even a change the reader would decode without a word (a few bytes of a page zeroed)
    stops the run before anything, naming the file and what to do (exit 2, no
    traceback), the run's checkpoints kept. With ``data.verify: size`` the read that
    meets a torn page fails the same way."""
    run_dir, data_dir = trained
    manifest = meta_io.Manifest.load(str(data_dir))
    victim = data_dir / manifest.files_of("warm")[0].path
    middle = victim.stat().st_size // 2
    _damage_in_place(victim, middle, middle + 16)
    assert main(["train", "--fresh", *_sets(run_dir, data_dir)]) == 2
    err = capsys.readouterr().err
    assert f"gmeta: error: {victim}: checksum mismatch" in err
    assert "gmeta data prepare --overwrite" in err and "Traceback" not in err
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]
    assert main(["eval", *_sets(run_dir, data_dir)]) == 2  # the references read it
    assert f"{victim}: checksum mismatch" in capsys.readouterr().err
    assert not (run_dir / "eval").exists()

    _damage_in_place(victim, 4, middle)  # pages zeroed, the footer kept
    size_only = _sets(run_dir, data_dir, 4, "data.verify=size")
    assert main(["train", "--fresh", *size_only]) == 2
    err = capsys.readouterr().err
    assert f"gmeta: error: {victim}: cannot read rows" in err
    assert "gmeta data prepare --overwrite" in err and "Traceback" not in err
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]


def test_eval_checks_the_split_it_scores(trained, capsys):
    run_dir, data_dir = trained
    manifest = meta_io.Manifest.load(str(data_dir))
    victim = data_dir / manifest.files_of("cold")[0].path
    _damage_in_place(victim, victim.stat().st_size // 2, victim.stat().st_size // 2 + 8)
    assert main(["eval", *_sets(run_dir, data_dir)]) == 2
    assert f"gmeta: error: {victim}: checksum mismatch" in capsys.readouterr().err
    assert main(["eval", "--validation-only", *_sets(run_dir, data_dir)]) == 0


def test_fresh_sets_old_checkpoints_aside_until_its_first_checkpoint(trained, monkeypatch):
    run_dir, data_dir = trained
    real_save = checkpoint.save

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "save", disk_full)
    with pytest.raises(OSError):
        main(["train", "--fresh", *_sets(run_dir, data_dir, 2)])
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]  # moved back
    assert [p.name for p in run_dir.iterdir() if "replaced" in p.name] == []

    monkeypatch.setattr(checkpoint, "save", real_save)
    assert main(["train", "--fresh", *_sets(run_dir, data_dir, 2)]) == 0
    assert _checkpoints(run_dir) == ["ckpt-2"]  # the new run's
    assert [p.name for p in run_dir.iterdir() if "replaced" in p.name] == []


@pytest.mark.parametrize("key, value, expected", [
    ("eval.relevance_label", "nope", "expected a label of the dataset scored, one of ['label']"),
    ("eval.binary_label", "rating", "expected a label of the dataset scored, one of ['label']"),
    ("eval.split", "foo", "expected a split of the dataset scored, one of ['cold', 'valid', "
                          "'warm']"),
])
def test_a_key_naming_what_the_dataset_lacks_stops_eval_and_train_first(
        trained, capsys, key, value, expected):
    run_dir, data_dir = trained
    sets = _sets(run_dir, data_dir, 4, "train.eval_every=2", f"{key}={value}")
    assert main(["eval", *sets]) == 2
    assert f"config key '{key}' = {value!r} is not allowed: {expected}" in capsys.readouterr().err
    assert not (run_dir / "eval").exists()  # stopped before evaluating
    if key != "eval.split":  # training never reads the evaluation split
        assert main(["train", "--fresh", *sets]) == 2
        assert f"config key '{key}' = {value!r}" in capsys.readouterr().err
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]


def test_the_documented_launcher_exits_2_with_the_ranks_message(tiny_data, tmp_path):
    command = [gmeta(), "train", "--np", "2", *_sets(tmp_path / "run", tiny_data, 4,
                                                    "eval.relevance_label=nope")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                            cwd=tmp_path, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-4000:]
    message = (f"gmeta: error: config key 'eval.relevance_label' = 'nope' is not allowed: "
               f"expected a label of the dataset at {tiny_data}, one of ['label']")
    assert result.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in output and "[1]<stderr>" in output  # both ranks ran
    # said once: not again by each rank, nor horovodrun's account of the ranks it stopped
    assert output.count(message.split("gmeta: error: ")[1]) == 1, output[-4000:]
    assert "exit with status code" not in output and "Terminating remaining" not in output


def test_the_launcher_refuses_to_train_over_checkpoints_before_any_rank_starts(trained):
    run_dir, data_dir = trained
    command = [gmeta(), "train", "--np", "2", *_sets(run_dir, data_dir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"gmeta: error: run_dir {run_dir} already has checkpoints (latest ckpt-4): pass "
        f"--resume to continue from it or --fresh to start over")
    assert "<stderr>" not in result.stdout + result.stderr  # no rank was started
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]


def _ratings_pipeline(tmp_path: Path, *more: str):
    write_ratings(tmp_path, users=800)
    mapping = {"task": "user_id", "label": "rating", "label_threshold": 4,
               "sparse": ["item_id", "year"], "multi_hot": {"genres": 3},
               "join": [{"path": "items.csv", "key": "item_id"}]}
    (tmp_path / "p.yaml").write_text(
        "model:\n  tables: {item: {features: [item_id, year]}}\n")
    overrides = ["data.source=csv", f"data.raw={tmp_path / 'ratings.csv'}",
                 f"data.path={tmp_path / 'data'}", f"data.mapping={mapping}",
                 "data.split={query_size: 5, min_rows: 10}", *more]
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        return load_config(str(tmp_path / "p.yaml"), overrides)
    finally:
        os.chdir(cwd)


def test_a_pipeline_converts_its_csv_and_remakes_it_when_the_csv_changes(tmp_path, caplog):
    config = _ratings_pipeline(tmp_path)
    first = prepare_dataset(config)
    assert first.split["source"]["kind"] == "csv"
    assert prepare_dataset(config).files == first.files  # used as it is
    def blocks(manifest):
        return {s: sum(len(f.blocks) for f in manifest.files_of(s))
                for s in ("warm", "valid", "cold")}

    assert min(blocks(first).values()) >= 16
    assert min(blocks(first).values()) < 40
    wide = prepare_dataset(config, world_size=40)  # more ranks than blocks: made again
    assert min(blocks(wide).values()) >= 40

    lines = (tmp_path / "ratings.csv").read_text().splitlines()
    (tmp_path / "ratings.csv").write_text("\n".join(lines[:1]) + "\n")  # a header only
    with pytest.raises(meta_io.DataError, match="ratings.csv: no data rows in the input"):
        prepare_dataset(config)
    assert meta_io.Manifest.load(config.data.path).files == wide.files  # the good one stays


def test_a_dataset_split_before_long_validation_tasks_were_trained_on_is_made_again(
        tmp_path, caplog):
    config = _ratings_pipeline(tmp_path, "data.split={query_size: 5, min_rows: 10, "
                                         "max_rows: 14, valid_fraction: 0.3}")
    first = prepare_dataset(config)
    moved = first.split["long_tasks_moved_to_warm"]
    assert moved > 0 and first.split["valid_tasks"] > 0
    # A dataset written before: its long tasks drawn for validation were dropped, and its
    # manifest has no count of them. It is made again (it would train on fewer tasks).
    path = Path(config.data.path) / MANIFEST_NAME
    record = json.loads(path.read_text())
    del record["split"]["long_tasks_moved_to_warm"]
    path.write_text(json.dumps(record))
    caplog.set_level(logging.WARNING)
    again = prepare_dataset(config)
    assert "was split before long warm tasks drawn for validation were trained on" in (
        caplog.text)
    assert again.split["long_tasks_moved_to_warm"] == moved
    assert prepare_dataset(config).files == again.files  # and then used as it is
    # a meta model's validation share of rows is meant to differ from valid_fraction (its
    # scored tasks are cut at max_rows, long warm tasks train whole): no warning for it
    rows = {s: c["rows"] for s, c in again.per_split().items()}
    assert rows["valid"] / (rows["valid"] + rows["warm"]) < 0.3 / 2
    assert "the validation split holds" not in caplog.text


def test_eval_data_from_a_file_keeps_the_protocols_bound_on_scored_tasks(tmp_path):
    """A file given to gmeta eval is scored whole under the pipeline's protocol: a task of
    more than max_rows rows is dropped there, as it is from the validation and cold
    splits (every setting was chosen on tasks of at most that many rows)."""
    from gmeta_tf.training.dataset_prep import eval_dataset

    config = _ratings_pipeline(tmp_path, "data.split={query_size: 5, min_rows: 10, "
                                         "max_rows: 14, valid_fraction: 0.3}")
    name, out = eval_dataset(config, str(tmp_path / "ratings.csv"))
    manifest = meta_io.Manifest.load(out)
    assert name == "ratings" and manifest.split["dropped_long"] > 0
    rows = meta_io.TaskDataset(out, "warm", rank=0, size=1).rows(100_000)
    tasks = np.concatenate([np.asarray(b["task_id"]) for b in rows])
    assert np.unique(tasks, return_counts=True)[1].max() <= 14


def test_a_dataset_source_refuses_a_config_it_does_not_fit(tmp_path):
    made = _ratings_pipeline(tmp_path)
    made_files = prepare_dataset(made).files
    config = _ratings_pipeline(tmp_path, "data.source=dataset", "data.raw=null",
                               "data.mapping=null", "data.rows_per_block=7")
    with pytest.raises(ConfigError, match=r"the dataset there was written with "
                                          r"rows_per_block auto, the config asks for "
                                          r"data.rows_per_block = 7"):
        prepare_dataset(config)
    config = _ratings_pipeline(tmp_path, "data.source=dataset", "data.raw=null",
                               "data.mapping=null", "data.split={query_size: 3}")
    with pytest.raises(ConfigError, match=r"was split with query_size = 5, the config asks for "
                                          r"data.split.query_size = 3"):
        prepare_dataset(config)
    # every difference in one error, with the flags and the keys that would fix them
    config = _ratings_pipeline(tmp_path, "data.source=dataset", "data.raw=null",
                               "data.mapping=null", "data.rows_per_block=7",
                               "data.split={query_size: 3, min_rows: 10, train_long_tasks: false}")
    with pytest.raises(ConfigError) as caught:
        prepare_dataset(config)
    message = str(caught.value)
    for part in ("query_size = 5, the config asks for data.split.query_size = 3",
                 "train_long_tasks = True, the config asks for data.split.train_long_tasks = "
                 "False", "rows_per_block auto, the config asks for data.rows_per_block = 7",
                 "--overwrite --query-size 3 --no-train-long-tasks --rows-per-block 7",
                 "data.split.query_size: 5, data.split.train_long_tasks: true, "
                 "data.rows_per_block: null", "leave out data.split and data.rows_per_block"):
        assert part in message, message
    # ... and leaving them out reads the dataset as it was converted
    config = _ratings_pipeline(tmp_path, "data.source=dataset", "data.raw=null",
                               "data.mapping=null", "data.split=null", "data.rows_per_block=null")
    assert prepare_dataset(config).files == made_files


def test_a_csv_pipeline_needs_its_mapping_and_names_a_bad_mapping_key(tmp_path):
    from gmeta_tf.config import from_dict
    from gmeta_tf.training.dataset_prep import csv_mapping

    tables = {"model": {"tables": {"t": {"features": ["item_id"]}}}}
    with pytest.raises(ConfigError, match=r"'data.mapping' = None is not allowed: expected the "
                                          r"column mapping of data.source 'csv'"):
        from_dict({**tables, "data": {"source": "csv", "raw": "r.csv"}})
    with pytest.raises(ConfigError, match=r"'data.mapping' = .* expected no mapping for "
                                          r"data.source 'synthetic'"):
        from_dict({**tables, "data": {"mapping": {"task": "u", "label": "y"}}})
    with pytest.raises(ConfigError, match=r"config key 'data.mapping.sparce' is not allowed: "
                                          r"unknown mapping keys \['sparce'\]"):
        from_dict({**tables, "data": {"source": "csv", "raw": "r.csv",
                                      "mapping": {"task": "u", "label": "y",
                                                  "sparce": ["item_id"]}}})
    with pytest.raises(ConfigError, match=r"config key 'data.mapping.columns' is not allowed: "
                                          r"mapping key 'columns' .*got 'u'.* a list of column"):
        from_dict({**tables, "data": {"source": "csv", "raw": "r.csv",
                                      "mapping": {"task": "u", "label": "y", "columns": "u"}}})
    mapping_file = tmp_path / "mapping.yaml"  # a mapping file: read and checked by prepare
    mapping_file.write_text("task: u\nlabel: y\nsparce: [item_id]\n")
    config = from_dict({**tables, "data": {"source": "csv", "raw": "r.csv",
                                           "mapping": str(mapping_file)}})
    with pytest.raises(ConfigError, match=r"config key 'data.mapping' is not allowed: "
                                          r".*mapping.yaml: unknown mapping keys \['sparce'\]"):
        csv_mapping(config)


def test_a_click_log_without_a_task_validates_on_a_fraction_of_its_rows(tmp_path, caplog):
    # one site with 300 of the 400 impressions: a split that draws sites is lopsided
    rows = ["site,app,click"] + [f"s{0 if i < 300 else i % 50},a{i % 7},{int(i % 5 == 0)}"
                                 for i in range(400)]
    (tmp_path / "clicks.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "p.yaml").write_text(
        "model:\n  tables: {t: {features: [site, app]}}\n  head: {kind: binary}\n"
        "meta:\n  enabled: false\n")
    rows_split = "data.split={warm_fraction: 1.0, valid_fraction: 0.1, query_size: 0, min_rows: 1}"

    def pipeline(mapping, *more):
        return load_config(str(tmp_path / "p.yaml"), [
            "data.source=csv", f"data.raw={tmp_path / 'clicks.csv'}",
            f"data.path={tmp_path / 'data'}", f"data.mapping={mapping}", *more])

    caplog.set_level(logging.WARNING)
    by_site = prepare_dataset(pipeline({"task": "site", "label": "click",
                                        "sparse": ["site", "app"]}, rows_split))
    valid = sum(f.rows for f in by_site.files_of("valid"))
    assert valid > 80 or valid < 20  # the big site is in it, or it holds a few rows
    assert "the validation split holds" in caplog.text
    assert "leave data.mapping.task out" in caplog.text

    caplog.clear()
    no_task = {"label": "click", "sparse": ["site", "app"]}
    by_row = prepare_dataset(pipeline(no_task, rows_split), overwrite=True)
    assert {s: sum(f.rows for f in by_row.files_of(s)) for s in ("warm", "valid")} == {
        "warm": by_row.split["warm_tasks"], "valid": by_row.split["valid_tasks"]}
    assert 20 <= by_row.split["valid_tasks"] <= 60  # about a tenth of the 400 rows
    assert "the validation split holds" not in caplog.text

    with pytest.raises(ConfigError, match=r"'data.split' is not allowed: query_size 10 and "
                                          r"min_rows 13 with no data.mapping.task; expected "
                                          r"query_size: 0 and min_rows: 1"):
        prepare_dataset(pipeline(no_task), overwrite=True)
    with pytest.raises(ConfigError, match=r"'data.mapping.task' is missing: a meta model "
                                          r"adapts to each task"):
        prepare_dataset(pipeline(no_task, rows_split, "meta.enabled=true"), overwrite=True)
    assert meta_io.Manifest.load(str(tmp_path / "data")).files == by_row.files  # kept


def test_a_table_naming_a_column_the_data_lacks_says_how_to_fit_the_config(trained, capsys):
    """A pipeline copied for other data (``pipelines/movielens.yaml`` over a ratings log
    whose columns are ``userId,movieId``) names features the dataset lacks: the error
    names the key and the dataset's features and says how to rename or drop them."""
    run_dir, data_dir = trained
    sets = _sets(run_dir, data_dir, 4, "model.tables.movie={features: [movieId]}")
    assert main(["train", "--fresh", *sets]) == 2
    err = capsys.readouterr().err
    assert "config key 'model.tables.movie.features' names 'movieId', which is not a sparse" in err
    assert "gmeta data csv --rename" in err and "pipelines/ratings.yaml" in err
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]
    # the same for a dense feature the dataset lacks
    sets = _sets(run_dir, data_dir, 4, "model.dense_features={runtime: 1}")
    assert main(["train", "--fresh", *sets]) == 2
    err = capsys.readouterr().err
    assert "config key 'model.dense_features.runtime' = 1 is not allowed" in err
    assert "gmeta data csv --rename" in err and "pipelines/ratings.yaml" in err
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]


def test_tune_stops_before_its_trials_on_a_pipeline_that_cannot_train(trained, capsys):
    """``gmeta tune`` checks the dataset as ``gmeta train`` does before any trial, and a
    first trial (the pipeline's own settings) that fails stops the study with the trial's
    own error: a copied pipeline used to fail every trial and point at their logs."""
    run_dir, data_dir = trained
    sets = _sets(run_dir, data_dir, 4, "train.eval_every=4", "data.source=dataset",
                 "data.rows_per_block=7")
    assert main(["tune", "--trials", "3", *sets]) == 2
    err = capsys.readouterr().err
    assert "the config asks for data.rows_per_block = 7" in err, err
    assert not (run_dir / "tune").exists()
    # a key naming a feature the dataset lacks fails in the trial (where the model is
    # built): the study stops after it, with its message
    sets = _sets(run_dir, data_dir, 4, "train.eval_every=4",
                 "model.tables.movie={features: [movieId]}")
    assert main(["tune", "--trials", "3", *sets]) == 2
    err = capsys.readouterr().err
    assert "the first trial, the pipeline's own settings, failed (exit" in err, err
    assert "config key 'model.tables.movie.features' names 'movieId'" in err, err
    assert sorted(p.name for p in (run_dir / "tune").iterdir()) == ["trial-0", "trials.json"]
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]


def _complete_checkpoints(run_dir: Path) -> list[int]:
    """The steps of the run's checkpoints whose MANIFEST.json (written last) is there."""
    folder = run_dir / "checkpoints"
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("ckpt-*")
                  if (p / "MANIFEST.json").is_file()) if folder.is_dir() else []


def _train_until_a_checkpoint(run_dir: Path, sets: list[str]) -> subprocess.Popen:
    """`gmeta train --fresh` started in its own process, returned once it has written a
    complete checkpoint (and is still training)."""
    import time

    proc = subprocess.Popen([gmeta(), "train", "--fresh", *sets], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 240
    while not _complete_checkpoints(run_dir):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.5)
    return proc


def _stopped_by(proc: subprocess.Popen, signum: int) -> str:
    """Sends ``signum`` to a running ``gmeta train``; returns its stderr once it ended
    (killed, and the test failed with that stderr, if it still ran 120 s later)."""
    proc.send_signal(signum)
    try:
        return proc.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:  # it trained on: the signal was lost
        proc.kill()
        pytest.fail(f"gmeta train still ran 120 s after signal {signum}:\n"
                    f"{proc.communicate()[1][-3000:]}")


def test_ctrl_c_says_what_is_kept_and_how_to_go_on(tiny_data, tmp_path):
    """Ctrl-C in a training run: one line naming what is kept and the --resume that goes
    on (status 130, no traceback); its checkpoints are whole and the run resumes."""
    import signal

    run_dir = tmp_path / "run"
    sets = _sets(run_dir, tiny_data, 100000, "train.checkpoint_every=7", "train.log_every=2")
    proc = _train_until_a_checkpoint(run_dir, sets)
    err = _stopped_by(proc, signal.SIGINT)
    assert proc.returncode == 130, err
    assert "gmeta: interrupted: every complete checkpoint is kept" in err, err
    assert "--resume goes on from the newest" in err and "Traceback" not in err, err
    step = _stopped_after(err, "Ctrl-C")
    assert _complete_checkpoints(run_dir)[-1] == step  # the step it stopped after
    checkpoint.verify(run_dir / "checkpoints" / f"ckpt-{step}")
    assert main(["train", "--resume", *_sets(run_dir, tiny_data, step + 2)]) == 0


def test_a_fresh_run_stopped_before_its_first_checkpoint_puts_the_earlier_ones_back(
        tiny_data, tmp_path):
    """Ctrl-C in a `train --fresh` that has written no checkpoint yet writes none at the
    stop: that would delete the earlier run's, set aside until the new run's first
    checkpoint; they come back instead, and --resume goes on from them."""
    import signal

    run_dir = tmp_path / "run"
    assert main(["train", *_sets(run_dir, tiny_data, 4, "train.checkpoint_every=2")]) == 0
    sets = _sets(run_dir, tiny_data, 100000, "train.checkpoint_every=0", "train.log_every=2")
    proc = subprocess.Popen([gmeta(), "train", "--fresh", *sets], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    seen = []
    for line in proc.stderr:  # until the new run has trained a few steps
        seen.append(line)
        if "] step 4/100000" in line:
            break
    else:
        pytest.fail("".join(seen)[-3000:])
    err = "".join(seen) + _stopped_by(proc, signal.SIGINT)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert "no checkpoint is written (this --fresh run has written none" in err, err[-3000:]
    assert "the earlier checkpoints are back in place" in err, err[-3000:]
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]
    assert main(["train", "--resume", *_sets(run_dir, tiny_data, 6)]) == 0


def _stopped_after(err: str, how: str) -> int:
    """The step a stopped ``gmeta train`` says it stopped after, checkpointed there (a
    checkpoint written at the stop, or the one that step had written)."""
    import re

    found = re.findall(rf"stopped by {how} after step (\d+) on every rank(: checkpoint "
                       rf"\S+ written|, whose checkpoint \S+ is written)", err)
    assert len(found) == 1, err[-3000:]
    return int(found[0][0])


def test_checkpoints_read_under_other_settings_name_the_keys(trained, capsys):
    """Settings changed since training (a tuned.yaml written since, a --set): a checkpoint
    they no longer fit is refused naming each key, its value and the one it was trained
    with; one they still fit is read with a warning saying the same."""
    run_dir, data_dir = trained
    assert main(["eval", *_sets(run_dir, data_dir, 4, "model.embedding_dim=6")]) == 2
    err = capsys.readouterr().err
    assert "dense weights do not fit this model" in err
    assert ("the run was trained under other settings" in err
            and "model.embedding_dim = 6 (trained with 4)" in err), err[-2000:]
    assert "gmeta train --fresh" in err and not (run_dir / "eval").exists()
    assert main(["eval", "--validation-only",
                 *_sets(run_dir, data_dir, 4, "meta.inner_lr=0.123")]) == 0
    assert "meta.inner_lr = 0.123 (trained with " in capsys.readouterr().err


def test_scores_of_another_source_of_the_same_name_are_not_replaced_silently(trained, capsys):
    run_dir, data_dir = trained
    first, second = run_dir.parent / "a" / "held", run_dir.parent / "b" / "held"
    for copy_to in (first, second):
        shutil.copytree(data_dir, copy_to)
    sets = _sets(run_dir, data_dir, 4, "eval.split=null")
    assert main(["eval", "--data", str(first), *sets]) == 0
    recorded = json.loads((run_dir / "eval" / "held.json").read_text())
    assert recorded["source"] == str(first)
    capsys.readouterr()
    assert main(["eval", "--data", str(second), *sets]) == 0
    assert (f"eval/held.json held the scores of {first}; it is replaced by those of "
            f"{second}") in capsys.readouterr().err


def test_a_second_run_in_a_run_dir_in_use_is_refused_and_sigterm_says_what_is_kept(
        tiny_data, tmp_path):
    """While `gmeta train` runs, a second `train` (even --fresh, which would set the first
    run's checkpoints aside and delete them) and a `tune` on the same run_dir are refused
    at once, naming the run that holds it; SIGTERM (a kill, `docker stop`) then stops the
    first as Ctrl-C does (one line, status 143, no traceback) and lets the run_dir go."""
    import signal

    run_dir = tmp_path / "run"
    sets = _sets(run_dir, tiny_data, 100000, "train.checkpoint_every=2", "train.log_every=2")
    proc = _train_until_a_checkpoint(run_dir, sets)
    folder = run_dir / "checkpoints"
    try:
        for verb in (["train", "--fresh"], ["tune", "--trials", "1"]):
            second = subprocess.run([gmeta(), *verb, *sets], capture_output=True, text=True,
                                    timeout=300)
            assert second.returncode == 2, second.stderr[-3000:]
            assert f"'gmeta train' (process {proc.pid} on " in second.stderr, second.stderr
            assert "is writing it" in second.stderr and "--set run_dir=" in second.stderr
            assert "Traceback" not in second.stderr
        assert not list(run_dir.glob("checkpoints.replaced-*"))  # nothing set aside
        assert not (run_dir / "tune").exists()
    finally:
        err = _stopped_by(proc, signal.SIGTERM)
    assert proc.returncode == 143, err
    assert "gmeta: terminated (SIGTERM): every complete checkpoint is kept" in err, err
    assert "Traceback" not in err, err
    step = _stopped_after(err, "SIGTERM")
    assert _complete_checkpoints(run_dir)[-1] == step
    checkpoint.verify(folder / f"ckpt-{step}")
    assert main(["train", "--resume", *_sets(run_dir, tiny_data, step + 2)]) == 0


def test_eval_after_a_fresh_run_killed_early_names_the_checkpoints_set_aside(trained,
                                                                             capsys):
    """A `train --fresh` killed before its first checkpoint leaves the earlier run's
    checkpoints set aside: eval and export say where, and that --resume puts them back."""
    run_dir, data_dir = trained
    aside = run_dir / "checkpoints.replaced-20260101T000000"
    os.replace(run_dir / "checkpoints", aside)  # as the killed --fresh run left them
    for verb in ("eval", "export"):
        assert main([verb, *_sets(run_dir, data_dir, 4)]) == 2
        err = capsys.readouterr().err
        assert f"the earlier run's are kept in {aside}" in err, err
        assert "'gmeta train --resume' puts them back" in err, err
    assert main(["train", "--resume", *_sets(run_dir, data_dir, 4)]) == 0
    assert _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]


def _read_only(run_dir: Path, command: list[str]) -> subprocess.CompletedProcess:
    """``command`` run with ``run_dir`` mounted read-only over itself, in a mount
    namespace of its own (nothing outside it sees the mount)."""
    script = ('mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && '
              'exec "$@"')
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(run_dir),
                           *command], capture_output=True, text=True, timeout=600)


def test_a_run_dir_that_cannot_be_written_is_refused_before_any_work(trained):
    """A read-only run_dir: eval, export and train stop at once, naming it and the
    system's reason (not a traceback after the evaluation's work)."""
    run_dir, data_dir = trained
    if os.geteuid() != 0 or shutil.which("unshare") is None or \
            _read_only(run_dir, ["true"]).returncode != 0:
        pytest.skip("needs root and unshare to mount the run directory read-only")
    sets = _sets(run_dir, data_dir, 4)
    for verb in (["eval"], ["export"], ["train", "--resume"]):
        result = _read_only(run_dir, [gmeta(), *verb, *sets])
        assert result.returncode == 2, (verb, result.stderr[-3000:])
        assert "is not writable (Read-only file system)" in result.stderr, result.stderr
        assert "nothing was started" in result.stderr and "Traceback" not in result.stderr
    assert not (run_dir / "eval").exists() and _checkpoints(run_dir) == ["ckpt-2", "ckpt-4"]
