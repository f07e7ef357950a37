"""train (horovodrun -np 2) -> eval -> export -> load in a fresh process: equal predictions."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from gmeta_tf import data as meta_io
from gmeta_tf.cli import main
from gmeta_tf.training.cold_start import restore_models
from tests.product.conftest import (cold_query_rows, pooled_auc, run_on_two_ranks, served,
                                    served_and_expected, set_args, task_rows, tiny_overrides)

pytestmark = pytest.mark.horovod  # the module's fixture trains under horovodrun -np 2
UNKNOWN_ID = 987_654_321_000
MAML_PLUS_PLUS = ["meta.inner_steps=2", "meta.learn_inner_lr=true",
                  "meta.inner_lr_per_step=true", "meta.inner_lr_per_element=true"]


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    """A run trained by 2 ranks, then evaluated and exported by the gmeta command; its
    inner loop has 2 steps with learned rates per step and per element (MAML++), which the
    exported ``adapt`` signature must follow."""
    run_dir = tmp_path_factory.mktemp("round_trip")
    return run_on_two_ranks(tiny_overrides(run_dir, tiny_data) + MAML_PLUS_PLUS, timeout=900)


def test_training_wrote_checkpoints_summary_and_tensorboard(trained):
    summary = json.loads(Path(trained.run_dir, "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 8
    assert np.isfinite(summary["final_loss"]) and summary["alltoall_bytes_per_step"] > 0
    assert Path(summary["checkpoint"]).name == "ckpt-8"
    assert os.listdir(trained.tensorboard_dir)
    # The figures depend on the CPU's kernels: the summary names the machine.
    assert summary["machine"]["cpu"] and summary["machine"]["cores"] >= 1


def test_eval_compares_meta_model_with_baseline(trained):
    """eval/cold.json scores both restored models on every cold task and query row: its
    unadapted rows equal the AUC recomputed here from each model's own predictions, and
    adapting (the meta model's inner loop) changes the figures."""
    result = json.loads(Path(trained.run_dir, "eval", f"{trained.eval.split}.json").read_text())
    # the scored split's query rows that repeat a support row, as the conversion counted
    assert result["query_rows_in_support"] == meta_io.Manifest.load(trained.data.path).split[
        f"{trained.eval.split}_query_rows_in_support"]
    rows = {r["name"]: r for r in result["rows"]}
    adapted = next(r for n, r in rows.items() if n.startswith("meta (maml, adapted"))
    meta_plain, base_plain = rows["meta, no adaptation"], rows["baseline, no fine-tuning"]
    assert any(n.startswith("baseline fine-tuned") for n in rows), list(rows)
    assert result["machine"]["cpu"] and "instruction_sets" in result["machine"]

    models, manifest = restore_models(trained)
    assert manifest["step"] == result["step"]  # the checkpoint gmeta eval chose
    label = trained.eval.binary_label or models.model.head.label
    meta_scores, labels, tasks = cold_query_rows(models.model, trained.data.path, label)
    base_scores, _, _ = cold_query_rows(models.baseline, trained.data.path, label)
    for row in (adapted, meta_plain, base_plain):  # the very same cold tasks and rows
        assert (row["tasks"], row["rows"]) == (tasks, len(labels)), row
    np.testing.assert_allclose(meta_plain["auc"], pooled_auc(labels, meta_scores), atol=1e-4)
    np.testing.assert_allclose(base_plain["auc"], pooled_auc(labels, base_scores), atol=1e-4)
    assert meta_plain["auc"] != base_plain["auc"]  # two models, not one scored twice
    assert adapted["logloss"] != meta_plain["logloss"]  # the inner loop ran
    # The adapted meta model's paired gap over every other row is the difference of their
    # figures, with an interval around it over resamples of the cold tasks
    paired = {p["name"]: p for p in result["paired"]}
    assert list(paired) == [r["name"] for r in result["rows"][1:]]
    for name, p in paired.items():
        assert (p["unit"], p["units"]) == ("task", tasks)
        for metric in ("auc", "logloss"):
            gap = p["metrics"][metric]
            np.testing.assert_allclose(gap["gap"], adapted[metric] - rows[name][metric],
                                       atol=1e-9)
            assert gap["low"] <= gap["gap"] <= gap["high"] and 0.0 <= gap["first_better"] <= 1.0


def test_eval_scores_the_cold_tasks_by_support_size_too(trained):
    """cold.json's ``by_support_size``: bands of the cold tasks by how many support rows each
    was adapted on, every task in one, each band's unadapted AUC that of its own tasks'
    query rows (recomputed here from the data's support masks)."""

    result = json.loads(Path(trained.run_dir, "eval", f"{trained.eval.split}.json").read_text())
    bands = result["by_support_size"]
    total = result["rows"][0]["tasks"]
    assert bands and sum(b["tasks"] for b in bands) == total
    assert all([r["name"] for r in b["rows"]] == [r["name"] for r in result["rows"]]
               for b in bands)
    edges = [tuple(map(int, b["support"].split("-"))) for b in bands]
    assert all(lo <= hi for lo, hi in edges)
    assert all(a[1] < b[0] for a, b in zip(edges, edges[1:]))

    models, _ = restore_models(trained)
    label = trained.eval.binary_label or models.model.head.label
    scores, labels, support = [], [], []
    for batch in meta_io.read_tasks(str(trained.data.path), 8, None, None, split="cold"):
        real = np.asarray(batch["query"]["mask"]) > 0
        sizes = (np.asarray(batch["support"]["mask"]) > 0).sum(axis=1)
        scores.append(np.asarray(models.model.adapted_predictions(batch, steps=0))[real])
        labels.append(np.asarray(batch["query"][label])[real])
        support.append(np.broadcast_to(sizes[:, None], real.shape)[real])
    scores, labels, support = map(np.concatenate, (scores, labels, support))
    for band, (low, high) in zip(bands, edges):
        keep = (support >= low) & (support <= high)
        plain = next(r for r in band["rows"] if r["name"] == "meta, no adaptation")
        assert plain["rows"] == int(keep.sum())
        if plain["auc"] is not None:
            np.testing.assert_allclose(plain["auc"], pooled_auc(labels[keep], scores[keep]),
                                       atol=1e-4)


def test_eval_validation_scores_the_validation_split_the_same_way(trained):
    """``gmeta eval --validation`` also writes eval/valid.json: the same contenders on every
    validation task's query rows (recomputed here), with their paired gaps; cold.json is
    still the cold split's."""
    split = trained.train.validation_split
    valid = json.loads(Path(trained.run_dir, "eval", f"{split}.json").read_text())
    cold = json.loads(Path(trained.run_dir, "eval", f"{trained.eval.split}.json").read_text())
    assert (valid["role"], valid["split"], cold["role"]) == ("validation", split, "evaluation")
    assert [r["name"] for r in valid["rows"]] == [r["name"] for r in cold["rows"]]
    assert [p["name"] for p in valid["paired"]] == [r["name"] for r in valid["rows"][1:]]
    models, _ = restore_models(trained)
    label = trained.eval.binary_label or models.model.head.label
    scores, labels, tasks = cold_query_rows(models.model, trained.data.path, label, split=split)
    plain = next(r for r in valid["rows"] if r["name"] == "meta, no adaptation")
    assert (plain["tasks"], plain["rows"]) == (tasks, len(labels))
    assert tasks != next(r for r in cold["rows"] if r["name"] == "meta, no adaptation")["tasks"]
    np.testing.assert_allclose(plain["auc"], pooled_auc(labels, scores), atol=1e-4)


def test_eval_validation_only_scores_the_validation_split_alone(trained, tiny_data, capsys):
    """``gmeta eval --validation-only`` prints and writes the validation split's table and
    leaves the cold split unscored: its result file is not rewritten."""
    eval_dir = Path(trained.run_dir, "eval")
    cold = eval_dir / f"{trained.eval.split}.json"
    before = (cold.read_bytes(), cold.stat().st_mtime_ns)
    sets = set_args(tiny_overrides(Path(trained.run_dir), tiny_data) + MAML_PLUS_PLUS)
    capsys.readouterr()
    assert main(["eval", "--validation-only", *sets]) == 0
    out = capsys.readouterr().out
    split = trained.train.validation_split
    assert f"{split} ({eval_dir / split}.json" in out
    assert f"{trained.eval.split} (" not in out
    assert (cold.read_bytes(), cold.stat().st_mtime_ns) == before
    valid = json.loads((eval_dir / f"{split}.json").read_text())
    assert valid["role"] == "validation" and valid["rows"]
    assert main(["eval", "--validation-only", "--data", str(tiny_data), *sets]) == 2
    assert "is not allowed with --validation-only" in capsys.readouterr().err


def test_eval_data_of_one_name_is_refused_before_anything_is_scored(trained, tiny_data,
                                                                    tmp_path, capsys):
    """Each scored set writes eval/<name>.json (a file's name without its extension): two
    files of one name, or a file named as the scored split, would overwrite each other's
    results (and the first file's converted rows), so they are refused, naming both."""
    sets = set_args(tiny_overrides(Path(trained.run_dir), tiny_data) + MAML_PLUS_PLUS)
    for sub in ("dev", "test"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "part.csv").write_text("unused\n")
    (tmp_path / f"{trained.eval.split}.csv").write_text("unused\n")
    before = sorted(p.name for p in Path(trained.run_dir, "eval").rglob("*"))
    capsys.readouterr()
    assert main(["eval", "--data", str(tmp_path / "dev" / "part.csv"),
                 "--data", str(tmp_path / "test" / "part.csv"), *sets]) == 2
    err = capsys.readouterr().err
    assert (f"eval data '{tmp_path / 'test' / 'part.csv'}' would be scored as 'part', as eval "
            f"data '{tmp_path / 'dev' / 'part.csv'}' is") in err
    assert main(["eval", "--data", str(tmp_path / f"{trained.eval.split}.csv"), *sets]) == 2
    assert f"as the '{trained.eval.split}' split is" in capsys.readouterr().err
    assert sorted(p.name for p in Path(trained.run_dir, "eval").rglob("*")) == before


def test_eval_validation_refuses_a_split_the_dataset_lacks(trained, tiny_data, capsys):
    """A validation split the dataset does not have is named before anything is scored:
    the key, the value and the splits there are; every result file stays as it was."""
    eval_dir = Path(trained.run_dir, "eval")
    before = {f.name: f.read_bytes() for f in eval_dir.iterdir()}
    overrides = tiny_overrides(Path(trained.run_dir), tiny_data) + [
        "train.validation_split=holdout"]
    assert main(["eval", "--validation", *set_args(overrides)]) == 2
    assert ("config key 'train.validation_split' = 'holdout' is not allowed: expected a split "
            "of the dataset scored, one of ['cold', 'valid', 'warm'] to score with gmeta eval "
            "--validation") in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in eval_dir.iterdir()} == before


def test_saved_model_in_a_fresh_process_predicts_as_the_trained_model(trained, tmp_path):
    models, manifest = restore_models(trained)  # the best checkpoint, as gmeta export took
    model = models.model
    batch = next(iter(meta_io.read_tasks(trained.data.path, 4, None, None, split="cold")))
    batch = {"task_id": batch["task_id"],
             **{r: {k: v.numpy().copy() for k, v in batch[r].items()} for r in ("support", "query")}}
    batch["query"]["item_id"][0, 0] = UNKNOWN_ID  # unknown ids read the default row
    export_dir = Path(trained.export.dir, str(manifest["step"]))
    out, expected_rows, expected_adapted = served_and_expected(model, batch, export_dir,
                                                               tmp_path, timeout=120)
    np.testing.assert_allclose(out["serve"], expected_rows, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["adapt"], expected_adapted, rtol=1e-5, atol=1e-6)
    assert not np.allclose(expected_adapted, expected_rows)  # adaptation changed the scores


def test_the_saved_model_adapts_for_the_steps_gmeta_eval_adapts_for(trained, tmp_path):
    """With eval.adapt_steps set (here 1, the model's k being 2) gmeta export's adapt
    signature takes those steps, as gmeta eval scored the model: what is served is what
    was measured."""
    from gmeta_tf.serving import saved_model_export

    config = dataclasses.replace(trained, eval=dataclasses.replace(trained.eval,
                                                                   adapt_steps=1))
    models, _ = restore_models(config)
    batch = next(iter(meta_io.read_tasks(trained.data.path, 4, None, None, split="cold")))
    out = saved_model_export.export_pipeline(config, out=str(tmp_path / "export" / "1"))
    support, query = task_rows(batch, "support", 0), task_rows(batch, "query", 0)
    features = models.model.tower.feature_names
    served_scores = served(Path(out["path"]), {
        **{f"adapt/support_{k}": support[k] for k in (*features, models.model.head.label)},
        **{f"adapt/query_{k}": query[k] for k in features}}, tmp_path, timeout=120)["adapt"]
    real = np.asarray(batch["query"]["mask"][0]) > 0
    one_step = models.model.adapted_predictions(batch, steps=1).numpy()[0][real]
    two_steps = models.model.adapted_predictions(batch).numpy()[0][real]
    np.testing.assert_allclose(served_scores, one_step, rtol=1e-5, atol=1e-6)
    assert not np.allclose(one_step, two_steps)


def test_a_request_whose_inputs_differ_in_length_is_refused_naming_them(trained):
    """A support label short of the support rows used to be broadcast over them (one label
    for every row) and served without a word; query inputs of two lengths failed naming a
    graph node. Both signatures now refuse such a request naming the inputs, and the adapt
    signature one whose support labels are NaN or outside the dataset's label range (here
    [0, 1])."""
    models, manifest = restore_models(trained)
    features = models.model.tower.feature_names
    batch = next(iter(meta_io.read_tasks(trained.data.path, 4, None, None, split="cold")))
    support, query = task_rows(batch, "support", 0), task_rows(batch, "query", 0)
    assert len(support[models.model.head.label]) >= 2 and len(query[features[0]]) >= 2
    loaded = tf.saved_model.load(str(Path(trained.export.dir, str(manifest["step"]))))
    request = {**{f"support_{k}": tf.constant(support[k]) for k in features},
               f"support_{models.model.head.label}": tf.constant(
                   support[models.model.head.label][:1]),  # one label for many rows
               **{f"query_{k}": tf.constant(query[k]) for k in features}}
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="signature adapt: input support_"):
        loaded.signatures["adapt"](**request)
    request[f"support_{models.model.head.label}"] = tf.constant(
        support[models.model.head.label])
    loaded.signatures["adapt"](**request)  # the whole request is served
    nan_label = np.array(support[models.model.head.label], np.float32)
    nan_label[-1] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="signature adapt: input support_.* holds a NaN or infinite"):
        loaded.signatures["adapt"](**{**request, f"support_{models.model.head.label}":
                                      tf.constant(nan_label)})
    assert models.model.head.kind == "binary"
    info = json.loads(Path(trained.export.dir, str(manifest["step"]), "assets.extra",
                           "gmeta_export.json").read_text())
    assert info["support_label_range"] == [0.0, 1.0]  # the dataset's label range
    rating_label = np.array(support[models.model.head.label], np.float32) + 3.0
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="signature adapt: input support_.* outside \\[0, 1\\]"):
        loaded.signatures["adapt"](**{**request, f"support_{models.model.head.label}":
                                      tf.constant(rating_label)})
    short = {k: tf.constant(query[k]) for k in features}
    short[features[-1]] = short[features[-1]][:1]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="signature serving_default: input .* has another number of "
                             "rows"):
        loaded.signatures["serving_default"](**short)


def test_exported_graph_has_no_custom_op(trained):
    from tensorflow.core.protobuf import saved_model_pb2

    (export_dir,) = Path(trained.export.dir).iterdir()  # one version: the best checkpoint's
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(Path(export_dir, "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0].graph_def
    ops = {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
    assert {"LowerBound", "GatherV2"} <= ops  # the frozen tables' searchsorted + gather
    assert not ops - set(dir(tf.raw_ops)), "ops outside stock TensorFlow"


def test_an_export_appears_whole_and_replaces_a_version_only_once_complete(trained, tmp_path):
    """A server loads any numeric directory under the export dir: a version is written
    under a hidden name and renamed into place. An export that fails part-way leaves the
    version already there as it was; one that succeeds replaces it, and nothing else is
    left beside it."""
    from gmeta_tf.serving import saved_model_export

    version = tmp_path / "serving" / "8"
    saved_model_export.export_pipeline(trained, out=str(version))
    first = (version / "saved_model.pb").read_bytes()

    def crash(module, path, signatures=None):
        Path(path).mkdir(parents=True, exist_ok=True)
        Path(path, "saved_model.pb").write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tf.saved_model, "save", crash)
        with pytest.raises(OSError, match="disk full"):
            saved_model_export.export_pipeline(trained, out=str(version))
    assert (version / "saved_model.pb").read_bytes() == first
    assert [p.name for p in version.parent.iterdir()] == ["8"]

    info = saved_model_export.export_pipeline(trained, out=str(version))
    assert [p.name for p in version.parent.iterdir()] == ["8"]
    assert info["path"] == str(version)
    recorded = json.loads((version / "assets.extra" / saved_model_export.INFO_FILE).read_text())
    assert recorded["path"] == str(version) and recorded["table_rows"] == info["table_rows"]


def test_an_export_puts_back_what_a_killed_export_set_aside(trained, tmp_path, caplog):
    """An export killed between its two renames leaves the version it replaces set aside
    (``.8.tmp-PID@HOST.*.old``) and its own staged model beside it: the next export into
    the same place puts the old one back before anything else, removes the staged one,
    and replaces the version whole; a live export's staging directory is left alone."""
    import socket
    import subprocess

    from gmeta_tf.serving import saved_model_export

    version = tmp_path / "serving" / "8"
    saved_model_export.export_pipeline(trained, out=str(version))
    first = (version / "saved_model.pb").read_bytes()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process id no longer running
    killed = version.with_name(f".8.tmp-{gone.pid}@{socket.gethostname()}.x1")
    killed.mkdir()
    (killed / "saved_model.pb").write_bytes(b"partial")
    version.rename(f"{killed}.old")
    live = version.with_name(f".8.tmp-{os.getppid()}@{socket.gethostname()}.x2")
    live.mkdir()
    with caplog.at_level("INFO"):
        saved_model_export.export_pipeline(trained, out=str(version))
    assert f"put back {version}: an export killed while replacing it (process {gone.pid})" in (
        caplog.text)
    assert f"removing {killed}, left by an export into {version}" in caplog.text
    assert sorted(p.name for p in version.parent.iterdir()) == sorted(["8", live.name])
    assert (version / "saved_model.pb").read_bytes() != b"partial"
    assert len(first) > 0


def test_an_export_replaces_an_export_and_nothing_else(trained, tmp_path):
    """`gmeta export --out` pointed at the export root (every version TF Serving serves) or
    at a directory of other files is refused before any work, naming the next version, and
    deletes nothing."""
    from gmeta_tf.config import ConfigError
    from gmeta_tf.serving import saved_model_export

    root = tmp_path / "serving"
    saved_model_export.export_pipeline(trained, out=str(root / "8"))
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError, match=rf"export path {root} holds no SavedModel but the "
                       rf"version directories 8 \(an export root: give its new version, e.g. "
                       rf"{root / '9'}\); nothing there is deleted"):
        saved_model_export.export_pipeline(trained, out=str(root))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    with pytest.raises(ConfigError, match=f"export path {notes} holds no SavedModel but "
                                          f"'todo.txt'"):
        saved_model_export.export_pipeline(trained, out=str(notes))
    assert (notes / "todo.txt").read_text() == "keep me"
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if not p.is_relative_to(notes)) == before


def test_a_new_export_is_the_version_served_above_an_earlier_runs(trained, tmp_path, caplog):
    """TF Serving serves the highest version: an export is its checkpoint's step unless a
    higher version made from another checkpoint is there (an earlier run's, before a
    --fresh run), then the next version above it; exported again from the same
    checkpoint, that version is replaced in place."""
    import dataclasses
    import shutil

    from gmeta_tf.serving import saved_model_export

    config = dataclasses.replace(trained, export=dataclasses.replace(
        trained.export, dir=str(tmp_path / "serving")))
    info = saved_model_export.export_pipeline(config)
    step = info["made_from"]["step"]
    assert info["path"] == str(tmp_path / "serving" / str(step))
    earlier = tmp_path / "serving" / str(step + 100)  # an earlier run's, a higher version
    shutil.copytree(info["path"], earlier)
    record = earlier / "assets.extra" / saved_model_export.INFO_FILE
    record.write_text(json.dumps({**json.loads(record.read_text()),
                                  "made_from": {"step": step + 100, "checkpoint": "other"}}))
    with caplog.at_level("WARNING"):
        info = saved_model_export.export_pipeline(config)
    assert info["path"] == str(tmp_path / "serving" / str(step + 101))
    assert f"holds version {step + 100}, above this export's step {step}" in caplog.text
    again = saved_model_export.export_pipeline(config)
    assert again["path"] == info["path"] and again["made_from"] == info["made_from"]
    assert sorted(int(p.name) for p in (tmp_path / "serving").iterdir()) == [
        step, step + 100, step + 101]


def test_the_served_label_range_is_the_declared_one_then_the_binary_head_s_then_the_data_s():
    from types import SimpleNamespace

    from gmeta_tf.serving.saved_model_export import _label_range

    declared = meta_io.Schema([meta_io.Feature("rating", "label", value_range=(1, 5))])
    bare = meta_io.Schema([meta_io.Feature("rating", "label")])
    rating, binary = (SimpleNamespace(label="rating", kind=k) for k in ("rating", "binary"))
    seen = {"rating": [0.5, 4.5]}
    assert _label_range(declared, rating, seen) == ((1.0, 5.0), "the dataset's label_range")
    assert _label_range(bare, binary, seen) == ((0.0, 1.0), "the binary head")
    assert _label_range(bare, rating, seen) == \
        ((0.5, 4.5), "the smallest and largest label of the dataset")
    assert _label_range(bare, rating, {}) == (None, None)  # converted before it was recorded
