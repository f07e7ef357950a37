"""Validation during training: the log, early stopping, the chosen checkpoints and what
gmeta eval / export restore; gmeta tune's settings reach gmeta train."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import yaml

from gmeta_tf import checkpoint
from gmeta_tf.config import load_config
from gmeta_tf.training import Trainer
from gmeta_tf.training.cold_start import evaluate_pipeline, restore_models
from gmeta_tf.training.trainer import SUMMARY_FILE
from gmeta_tf.training.selection import Selection, validation_protocol
from tests.product.conftest import TINY_BASELINE, set_args, tiny_overrides


def test_selection_keeps_each_models_best_and_counts_patience_per_model(tmp_path):
    """Each model's patience is its own: the baseline runs out at step 3 while the model
    still improves; the run is over when both have."""
    s = Selection("auc", patience=2)
    both = ["model", "baseline"]
    assert s.update(1, {"model": {"auc": 0.6}, "baseline": {"auc": 0.5}}) == ["model", "baseline"]
    assert s.update(2, {"model": {"auc": 0.7}, "baseline": {"auc": 0.4}}) == ["model"]
    assert s.update(3, {"model": {"auc": 0.65}, "baseline": {"auc": 0.45}}) == []
    assert s.stale == {"model": 1, "baseline": 2} and s.finished == {"baseline": 3}
    assert not s.should_stop(both) and s.should_stop(["baseline"])
    assert s.update(4, {"model": {"auc": 0.69}}) == []   # the baseline is validated no more
    assert s.should_stop(both) and s.finished == {"baseline": 3, "model": 4}
    assert s.protected_steps == {2, 1}
    s.save(tmp_path)
    again = Selection.load(tmp_path, "auc", 2)
    assert again.to_dict() == s.to_dict()
    replayed = Selection.load(tmp_path, "auc", 2, up_to_step=2)   # a resume from step 2
    assert replayed.stale == {"model": 0, "baseline": 1} and replayed.best["model"].step == 2
    assert replayed.finished == {}
    assert Selection.load(tmp_path, "auc", 2, up_to_step=3).finished == {"baseline": 3}
    nan = Selection("auc", patience=1)   # a NaN validation value is no improvement
    nan.update(1, {"model": {"auc": 0.6}})
    nan.update(2, {"model": {"auc": float("nan")}})
    assert nan.finished == {"model": 2}
    assert Selection.load(tmp_path, "mae", 2).best == {}           # another metric: anew
    lower = Selection("mae")
    lower.update(1, {"model": {"mae": 0.9}})
    assert lower.update(2, {"model": {"mae": 0.8}}) == ["model"]


def test_a_linear_start_stays_best_until_beaten_by_its_margin():
    """With ``train.linear_margin`` the validator reports, at every evaluation after the
    linear start (step 0), how far it must be beaten (``linear_margin``); a checkpoint
    inside that margin does not replace it, one beyond it does, and from then on the best
    is beaten as usual."""
    selection = Selection("auc")
    assert selection.update(0, {"model": {"auc": 0.70}}) == ["model"]
    assert selection.update(4, {"model": {"auc": 0.705, "linear_margin": 0.01}}) == []
    assert selection.best["model"].step == 0
    assert selection.update(8, {"model": {"auc": 0.715, "linear_margin": 0.01}}) == ["model"]
    assert selection.update(12, {"model": {"auc": 0.716, "linear_margin": 0.01}}) == ["model"]
    assert selection.best["model"].step == 12
    lower = Selection("logloss")
    lower.update(0, {"model": {"logloss": 0.50}})
    assert lower.update(4, {"model": {"logloss": 0.495, "linear_margin": 0.01}}) == []
    assert lower.update(8, {"model": {"logloss": 0.48, "linear_margin": 0.01}}) == ["model"]


def test_a_resume_validating_under_another_protocol_chooses_anew(tmp_path, caplog):
    """Values averaged over 4 splits of each task's rows, or scored on another split, are
    not compared with the saved ones: the resumed run chooses its best checkpoints anew."""
    four = validation_protocol("valid", 4)
    s = Selection("auc", patience=2, protocol=four)
    s.update(1, {"model": {"auc": 0.7}})
    s.save(tmp_path)
    assert Selection.load(tmp_path, "auc", 2, protocol=four).best["model"].step == 1
    with caplog.at_level(logging.WARNING):
        one = validation_protocol("valid", 1)
        assert Selection.load(tmp_path, "auc", 2, protocol=one).best == {}
    assert "resplits 4, split valid" in caplog.text and "resplits 1, split valid" in caplog.text
    assert Selection.load(tmp_path, "auc", 2, protocol=validation_protocol("other", 4)).best == {}
    # the same split made again from a log that grew holds other rows
    rows = validation_protocol("valid", 4, "aaaa")
    s = Selection("auc", patience=2, protocol=rows)
    s.update(1, {"model": {"auc": 0.7}})
    s.save(tmp_path)
    assert Selection.load(tmp_path, "auc", 2, protocol=rows).best["model"].step == 1
    assert Selection.load(tmp_path, "auc", 2,
                          protocol=validation_protocol("valid", 4, "bbbb")).best == {}
    s = Selection("auc", patience=2, protocol=four)  # saved before the rows were recorded
    s.update(1, {"model": {"auc": 0.7}})
    s.save(tmp_path)
    # A BEST.json from before the protocol was recorded: it validated under one split.
    legacy = json.loads((tmp_path / "BEST.json").read_text())
    del legacy["protocol"]
    (tmp_path / "BEST.json").write_text(json.dumps(legacy))
    assert Selection.load(tmp_path, "auc", 2, protocol=one).best["model"].step == 1
    assert Selection.load(tmp_path, "auc", 2, protocol=four).best == {}


def test_evaluations_during_pretraining_do_not_count_toward_patience(tmp_path):
    """Patience counts from ``patience_from`` (the end of pre-training), in a run and in
    the replay a resumed run makes of it."""
    s = Selection("auc", patience=1, patience_from=4)
    s.update(2, {"model": {"auc": 0.6}})
    s.update(4, {"model": {"auc": 0.5}})      # no better, but still pre-training
    assert s.stale == {"model": 0} and not s.should_stop(["model"])
    s.update(6, {"model": {"auc": 0.55}})
    assert s.should_stop(["model"])
    s.save(tmp_path)
    resumed = Selection.load(tmp_path, "auc", 1, up_to_step=4, patience_from=4)
    assert resumed.stale == {"model": 0} and not resumed.should_stop(["model"])
    assert Selection.load(tmp_path, "auc", 1, up_to_step=4).should_stop(["model"])  # stops


def test_the_baselines_patience_does_not_wait_for_the_meta_models_pretraining():
    """The baseline has no pre-training: its patience counts from its first evaluation,
    whatever pre-training the meta model beside it was given (in gmeta tune, each trial's
    draw), so a trial's baseline value never depends on the meta study's settings."""
    s = Selection("auc", patience=1, patience_from=4)
    s.update(2, {"model": {"auc": 0.6}, "baseline": {"auc": 0.6}})
    s.update(4, {"model": {"auc": 0.5}, "baseline": {"auc": 0.5}})
    assert s.stale == {"model": 0, "baseline": 1} and s.finished == {"baseline": 4}


@pytest.fixture(scope="module")
def stopped_run(tiny_data, tmp_path_factory):
    """A run with validation every 2 steps, patience 2, one checkpoint kept."""
    run_dir = tmp_path_factory.mktemp("selection")
    overrides = tiny_overrides(run_dir, tiny_data, steps=40) + [
        "train.eval_every=2", "train.patience=2", "train.keep_checkpoints=1",
        "train.checkpoint_every=0", "train.learning_rate=0.05", "meta.inner_lr=3.0"]
    config = load_config("default", overrides)
    return config, overrides


def test_training_logs_validation_stops_early_and_keeps_the_best_checkpoints(stopped_run,
                                                                             caplog):
    config, _ = stopped_run
    with caplog.at_level(logging.INFO, logger="gmeta_tf.training.trainer"):
        result = Trainer(config, fresh=True).run()
    text = caplog.text
    assert "validation (valid split" in text and "on auc" in text
    assert result.stopped_early_at is not None and result.stopped_early_at < 40
    assert f"early stopping at step {result.stopped_early_at}" in text
    best = json.loads(Path(config.checkpoint_dir, "BEST.json").read_text())
    assert set(best["best"]) == {"model", "baseline"}
    for name, b in best["best"].items():
        assert f"best checkpoint of the {name}: step {b['step']}" in text
        # The best is never pruned, though only 1 checkpoint is kept besides it.
        assert Path(config.checkpoint_dir, f"ckpt-{b['step']}", "MANIFEST.json").is_file()
        history = [h[name]["auc"] for h in best["history"] if name in h]
        assert b["value"] == max(history)
    steps = sorted(int(p.name.split("-")[1]) for p in Path(config.checkpoint_dir).glob("ckpt-*"))
    assert steps[-1] == result.stopped_early_at
    assert set(steps) <= {b["step"] for b in best["best"].values()} | {steps[-1]}
    # --resume with both models stopped: nothing trains, the losses they stopped with stand
    resumed = Trainer(config, resume=True).run()
    assert resumed.steps == resumed.start_step == result.stopped_early_at
    assert math.isfinite(resumed.final_loss) and resumed.final_loss == result.final_loss
    assert resumed.baseline_loss == result.baseline_loss


def test_pretraining_steps_train_the_plain_objective_then_meta_training(tiny_data, tmp_path,
                                                                       caplog):
    """``train.pretrain_steps``: during pre-training the learned inner rates get no gradient
    (nothing is adapted) while the tower trains; meta-training then moves them too."""
    import numpy as np

    from gmeta_tf.training.model_builder import build_models

    def rates_and_tower(pretrain: int) -> tuple[list, list]:
        overrides = tiny_overrides(tmp_path / f"pre{pretrain}", tiny_data, steps=4) + [
            f"train.pretrain_steps={pretrain}", "meta.learn_inner_lr=true",
            "train.eval_every=0"]
        config = load_config("default", overrides)
        Trainer(config, fresh=True).run()
        models = build_models(config)
        checkpoint.restore(checkpoint.latest(config.checkpoint_dir), models.state,
                           models.optimizers)
        return ([v.numpy() for v in models.model.inner_lr_variables.values()],
                [v.numpy() for v in models.model.tower.trainable_variables])

    fresh = build_models(load_config("default", tiny_overrides(tmp_path / "x", tiny_data)))
    initial_rates = [v.numpy() for v in fresh.model.inner_lr_variables.values()]
    initial_tower = [v.numpy() for v in fresh.model.tower.trainable_variables]
    with caplog.at_level(logging.INFO, logger="gmeta_tf.training.trainer"):
        rates, tower = rates_and_tower(4)
    assert "steps 1 to 4 pre-train the meta model on every row" in caplog.text
    assert initial_rates and all(np.array_equal(a, b) for a, b in zip(rates, initial_rates))
    assert any(not np.array_equal(a, b) for a, b in zip(tower, initial_tower))
    rates, _ = rates_and_tower(2)  # 2 steps of each: the rates move in the last two
    assert any(not np.array_equal(a, b) for a, b in zip(rates, initial_rates))


def test_patience_counts_from_the_end_of_pretraining(tiny_data, tmp_path):
    """With patience 1, validation every 2 steps and 12 pre-training steps, the run cannot
    stop before meta-training has had its own evaluation."""
    overrides = tiny_overrides(tmp_path, tiny_data, steps=24) + [
        "train.pretrain_steps=12", "train.eval_every=2", "train.patience=1",
        "train.learning_rate=0.05", "meta.inner_lr=3.0"]
    result = Trainer(load_config("default", overrides), fresh=True).run()
    assert result.stopped_early_at is None or result.stopped_early_at >= 14


def test_each_model_stops_on_its_own_patience_and_its_run_is_its_own(tiny_data, tmp_path,
                                                                     caplog):
    """A model that has not improved in ``patience`` evaluations stops training (and is
    validated no more) while the other trains on; the meta model's run, validation history
    and best step are the same beside a baseline training at another rate, so in ``gmeta
    tune`` one study's settings never move the other's trial values."""
    def run(name: str, baseline_rate: float):
        overrides = tiny_overrides(tmp_path / name, tiny_data, steps=16) + [
            "train.eval_every=2", "train.patience=2", "train.checkpoint_every=0",
            "train.learning_rate=0.01", f"train.baseline_learning_rate={baseline_rate}"]
        config = load_config("default", overrides)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="gmeta_tf.training.trainer"):
            result = Trainer(config, fresh=True).run()
        saved = json.loads(Path(config.checkpoint_dir, "BEST.json").read_text())
        return result, saved, caplog.text

    def out_of_patience(history: list[dict], name: str) -> int | None:
        """The 2nd evaluation in a row without a new best, counted from the history."""
        best, stale = -math.inf, 0
        for h in history:
            if name in h:
                best, stale = (h[name]["auc"], 0) if h[name]["auc"] > best else (best, stale + 1)
                if stale == 2:
                    return h["step"]
        return None

    runs = {rate: run(f"rate{rate}", rate) for rate in (0.01, 1e-4)}
    for result, saved, text in runs.values():
        steps = {n: [h["step"] for h in saved["history"] if n in h] for n in ("model", "baseline")}
        for name in ("model", "baseline"):
            end = out_of_patience(saved["history"], name)
            assert result.finished_at.get(name) == end == saved["finished"].get(name)
            assert steps[name] == list(range(2, (end or 16) + 1, 2))
        first, last = sorted(("model", "baseline"), key=lambda n: result.finished_at.get(n, 99))
        end = result.finished_at[first]
        # The model that stopped first reports the loss it stopped with, not NaN.
        assert math.isfinite(result.final_loss) and math.isfinite(result.baseline_loss)
        assert end < result.finished_at.get(last, 16) and result.steps == result.finished_at.get(
            last, 16)
        assert (f"step {end}: the {first} has not improved its validation auc in 2 evaluations: "
                f"it stops training here (best at step {result.best[first]['step']}); the "
                f"{last} trains on") in text
    (fast, fast_saved, _), (slow, slow_saved, _) = runs[0.01], runs[1e-4]
    assert [h.get("baseline") for h in fast_saved["history"]] != \
        [h.get("baseline") for h in slow_saved["history"]]
    assert [h["model"] for h in fast_saved["history"] if "model" in h] == pytest.approx(
        [h["model"] for h in slow_saved["history"] if "model" in h], rel=1e-6)
    assert fast.best["model"]["step"] == slow.best["model"]["step"]
    assert fast.best["model"]["value"] == pytest.approx(slow.best["model"]["value"], rel=1e-6)
    assert fast.finished_at.get("model") == slow.finished_at.get("model")


def test_the_baselines_tables_train_at_their_own_rate(tiny_data, tmp_path):
    """``train.baseline_table_learning_rate`` replaces every table's rate for the baseline
    alone: the meta model's tables keep theirs, and its validation history is the same
    whatever rate the baseline's rows learn at (``gmeta tune`` searches each model's)."""
    from gmeta_tf.training.model_builder import build_models

    def run(rate: float):
        overrides = tiny_overrides(tmp_path / f"rate{rate}", tiny_data, steps=8) + [
            "train.checkpoint_every=0", f"train.baseline_table_learning_rate={rate}"]
        config = load_config("default", overrides)
        models = build_models(config)
        rates = {name: {t.name: t.optimizer.learning_rate for t in m.embedding.table_configs}
                 for name, m in (("model", models.model), ("baseline", models.baseline))}
        Trainer(config, fresh=True).run()
        saved = json.loads(Path(config.checkpoint_dir, "BEST.json").read_text())
        return rates, saved["history"]

    own = {t: s.optimizer.learning_rate
           for t, s in load_config("default", tuned=False).model.tables.items()}
    (fast_rates, fast), (slow_rates, slow) = run(0.5), run(0.001)
    assert fast_rates["model"] == slow_rates["model"] == own
    assert fast_rates["baseline"] == {t: 0.5 for t in own}
    assert slow_rates["baseline"] == {t: 0.001 for t in own}
    assert [h["model"] for h in fast] == pytest.approx([h["model"] for h in slow], rel=1e-6)
    assert [h["baseline"] for h in fast] != [h["baseline"] for h in slow]


def test_a_diverged_loss_stops_training_and_keeps_the_best_checkpoints(
        tiny_data, tmp_path, monkeypatch, caplog):
    """Once every model's loss is NaN the run stops at the next log or validation step with
    a warning naming them, and eval restores the best checkpoints from before."""
    import numpy as np

    real = Trainer._sync_steps

    def poisoned(self, models, meter):
        train = real(self, models, meter)

        def step(batches, done, stop, vote):
            out, done, stopping = train(batches, done, stop, vote)
            nan = np.float32("nan")
            return ({**out, "loss": nan, "baseline_loss": nan} if stop > 8 else out), done, \
                stopping
        return step

    monkeypatch.setattr(Trainer, "_sync_steps", poisoned)
    overrides = tiny_overrides(tmp_path, tiny_data, steps=40) + ["train.eval_every=2"]
    config = load_config("default", overrides)
    with caplog.at_level(logging.INFO, logger="gmeta_tf.training.trainer"):
        result = Trainer(config, fresh=True).run()
    assert result.stopped_early_at == 10
    assert result.diverged_at == {"model": 10, "baseline": 10}
    assert ("step 10: not finite: the baseline's loss and the model's loss (training "
            "diverged); training stops here") in caplog.text
    best = json.loads(Path(config.checkpoint_dir, "BEST.json").read_text())["best"]
    assert set(best) == {"model", "baseline"} and best["model"]["step"] <= 8
    _, info = restore_models(config)
    assert info["chosen"]["model"]["step"] == best["model"]["step"]
    # --resume: both models stay stopped; nothing trains, the best checkpoints stand
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gmeta_tf.training.trainer"):
        resumed = Trainer(config, resume=True).run()
    assert resumed.stopped_early_at == 10 and resumed.diverged_at == result.diverged_at
    assert ("every model stopped training before step 10: the model at step 10 (not "
            "finite), the baseline at step 10 (not finite); nothing to train") in caplog.text
    assert json.loads(Path(config.checkpoint_dir, "BEST.json").read_text())["best"] == best


def test_a_diverged_model_stops_while_the_other_trains_on(tiny_data, tmp_path, caplog):
    """A meta model whose outer rate makes its loss truly not finite stops training: it is
    put back to its best checkpoint (so every later checkpoint is finite and restorable)
    and no longer validated, while the baseline (its own rate) trains and is validated on;
    its run is not cut short by the other's divergence."""
    import numpy as np

    from gmeta_tf.training.model_builder import build_models

    overrides = tiny_overrides(tmp_path, tiny_data, steps=12) + [
        "train.eval_every=1", "train.log_every=1", "train.patience=0",
        "train.learning_rate=1000000000000.0", "train.baseline_learning_rate=0.01"]
    config = load_config("default", overrides)
    with caplog.at_level(logging.INFO, logger="gmeta_tf.training.trainer"):
        result = Trainer(config, fresh=True).run()
    assert set(result.diverged_at) == {"model"} and result.stopped_early_at is None
    diverged = result.diverged_at["model"]
    saved = json.loads(Path(config.checkpoint_dir, "BEST.json").read_text())
    best = {n: b["step"] for n, b in saved["best"].items()}
    assert best["model"] < diverged < 12
    warning = [r.getMessage() for r in caplog.records if "not finite" in r.getMessage()]
    assert len(warning) == 1 and warning[0].startswith(
        f"step {diverged}: not finite: the model's loss")
    assert warning[0].endswith(
        f"(training diverged); the model stops training here, put back: the model to its "
        f"best checkpoint on validation (step {best['model']}); the baseline trains on")
    validated = {n: [h["step"] for h in saved["history"] if n in h] for n in ("model", "baseline")}
    assert validated["baseline"] == list(range(1, 13))
    assert validated["model"] == list(range(1, diverged))

    def weights(directory):
        models = build_models(config)
        checkpoint.restore(directory, models.state, models.optimizers)
        return ([v.numpy() for v in models.model.tower.trainable_variables],
                [v.numpy() for v in models.baseline.tower.trainable_variables])

    last_model, last_baseline = weights(checkpoint.latest(config.checkpoint_dir))
    best_model, _ = weights(Path(config.checkpoint_dir, f"ckpt-{best['model']}"))
    for a, b in zip(last_model, best_model):
        np.testing.assert_array_equal(a, b)
    assert all(np.isfinite(w).all() for w in last_model + last_baseline)
    _, info = restore_models(config)
    assert {n: c["step"] for n, c in info["chosen"].items()} == best

    # --resume with more steps: the model stays stopped at its best checkpoint (not trained
    # again at the rate that diverged), the baseline trains and is validated on
    more = load_config("default", [*overrides, "train.steps=15"])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gmeta_tf.training.trainer"):
        resumed = Trainer(more, resume=True).run()
    assert resumed.diverged_at == {"model": diverged} and resumed.stopped_early_at is None
    assert f"resumed: the model stopped training at step {diverged}" in caplog.text
    assert "not finite: the model's loss" not in caplog.text
    saved = json.loads(Path(config.checkpoint_dir, "BEST.json").read_text())
    validated = {n: [h["step"] for h in saved["history"] if n in h] for n in ("model", "baseline")}
    assert validated["baseline"] == list(range(1, 16))
    assert validated["model"] == list(range(1, diverged))
    last_model, _ = weights(checkpoint.latest(config.checkpoint_dir))
    for a, b in zip(last_model, best_model):
        np.testing.assert_array_equal(a, b)


def test_a_model_diverging_before_its_first_validation_goes_back_to_its_initial_weights(
        tiny_data, tmp_path, caplog):
    """With no best checkpoint yet, a diverged model goes back to its weights before
    training (kept beside the checkpoints for the run) and the other trains on; its later
    checkpoints are finite, and eval scores the baseline from its own best checkpoint."""
    import numpy as np

    from gmeta_tf.training.model_builder import build_models

    overrides = tiny_overrides(tmp_path, tiny_data, steps=12) + [
        "train.eval_every=4", "train.log_every=1", "train.patience=0",
        "train.learning_rate=1000000000000.0", "train.baseline_learning_rate=0.01"]
    config = load_config("default", overrides)
    with caplog.at_level(logging.INFO, logger="gmeta_tf.training.trainer"):
        result = Trainer(config, fresh=True).run()
    diverged = result.diverged_at["model"]
    assert diverged < 4 and result.stopped_early_at is None and result.steps == 12
    assert (f"step {diverged}: not finite: the model's loss (training diverged); the model "
            f"stops training here, put back: the model to its weights before training (it "
            f"diverged before its first validation); the baseline trains on") in caplog.text
    saved = json.loads(Path(config.checkpoint_dir, "BEST.json").read_text())
    assert set(saved["best"]) == {"baseline"}
    assert [h["step"] for h in saved["history"]] == [4, 8, 12]
    assert all(set(h) == {"step", "baseline"} for h in saved["history"])
    assert not Path(f"{config.checkpoint_dir}.initial").exists()   # gone with the run

    def model_weights(directory=None):
        models = build_models(config)
        if directory is not None:
            checkpoint.restore(directory, models.state, models.optimizers)
        return [v.numpy() for v in models.model.tower.trainable_variables]

    for a, b in zip(model_weights(checkpoint.latest(config.checkpoint_dir)), model_weights()):
        np.testing.assert_array_equal(a, b)    # the weights it was built with (model.seed)
    with caplog.at_level(logging.WARNING):
        _, info = restore_models(config)
    assert set(info["chosen"]) == {"baseline"}
    assert "the model has no checkpoint chosen on validation" in caplog.text


def test_eval_restores_each_models_best_checkpoint(stopped_run):
    config, _ = stopped_run
    best = json.loads(Path(config.checkpoint_dir, "BEST.json").read_text())["best"]
    models, info = restore_models(config)
    assert info["chosen"]["model"]["step"] == best["model"]["step"]
    # The baseline's variables are those of its own best checkpoint.
    import numpy as np

    from gmeta_tf.training.model_builder import build_models
    own = build_models(config)
    checkpoint.restore(Path(config.checkpoint_dir, f"ckpt-{best['baseline']['step']}"),
                       own.state, own.optimizers)
    for a, b in zip(models.baseline.tower.trainable_variables,
                    own.baseline.tower.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    results = evaluate_pipeline(config)
    assert [r["name"] for r in results] == ["cold"]
    saved = json.loads(Path(config.run_dir, "eval", "cold.json").read_text())
    names = [r["name"] for r in saved["rows"]]
    assert names[:2] == ["meta (maml, adapted k=1)", "meta, no adaptation"]
    assert "baseline fine-tuned (k=1)" in names
    assert {"reference: global mean", "reference: logistic regression"} <= set(names)
    assert any(n.endswith(" mean + task offset") for n in names)
    assert saved["chosen"]["baseline"]["step"] == best["baseline"]["step"]


def test_tuned_settings_apply_under_explicit_overrides(stopped_run, tmp_path):
    config, overrides = stopped_run
    tuned = Path(config.run_dir, "tuned.yaml")
    tuned.write_text(yaml.safe_dump({"meta": {"inner_lr": 0.123},
                                     "train": {"learning_rate": 0.0042}}))
    try:
        assert load_config("default", overrides[:-2]).meta.inner_lr == 0.123
        assert load_config("default", overrides).meta.inner_lr == 3.0   # --set wins
        assert load_config("default", overrides[:-2]).train.learning_rate == 0.0042
        assert load_config("default", overrides).train.learning_rate == 0.05
        assert load_config("default", overrides[:-2], tuned=False).meta.inner_lr != 0.123
        tuned.write_text("meta: [unclosed")
        with pytest.raises(Exception, match="tuned settings .*tuned.yaml"):
            load_config("default", overrides)
    finally:
        tuned.unlink()


def test_a_plain_ctr_model_trains_on_every_warm_row_once_an_epoch(tiny_data, tmp_path):
    from gmeta_tf import data as meta_io

    warm_rows = meta_io.TaskDataset(str(tiny_data), "warm", verify="size").num_rows
    batch = 64
    epoch_steps = -(-warm_rows // batch)       # the last batch of an epoch is partial
    overrides = tiny_overrides(tmp_path, tiny_data, steps=2 * epoch_steps) + [
        "meta.enabled=false", f"data.batch_size={batch}", "train.eval_every=0",
        "train.checkpoint_every=0", "train.log_every=1000"]
    result = Trainer(load_config("default", overrides), fresh=True).run()
    assert result.samples == 2 * warm_rows     # every row, twice, none cut


def test_gmeta_tune_gives_both_contenders_the_same_trials_and_writes_tuned_settings(
        tiny_data, tmp_path):
    from gmeta_tf.cli import main

    overrides = [o for o in tiny_overrides(tmp_path, tiny_data, steps=6)  # tuned.yaml's keys
                 if o not in TINY_BASELINE] + ["train.eval_every=2"]
    sets = set_args(overrides)
    assert main(["tune", "--config", "default", "--trials", "2", "--patience", "1",
                 "--rechecks", "1", *sets]) == 0
    trials = json.loads(Path(tmp_path, "tune", "trials.json").read_text())["trials"]
    assert len(trials) in (3, 4) and all(t["status"].startswith("ok") for t in trials)
    assert all(set(t["values"]) == {"model", "baseline"} for t in trials)
    # The first trial is the pipeline's own settings.
    assert trials[0]["settings"]["model"]["meta.inner_steps"] == 1
    # The third run re-checks each study's best trial with other seeds; a fourth, when a
    # study's best is not its own settings, re-checks those too (each study's second pick).
    assert all("re-check" in t["status"] for t in trials[2:])
    for name in ("model", "baseline"):
        best, other = sorted(trials[:2], key=lambda t: t["values"][name], reverse=True)
        assert trials[2]["settings"][name] == best["settings"][name]
        if len(trials) == 4:
            assert trials[3]["settings"][name] == other["settings"][name]
    assert Path(tmp_path, "tune", "recheck-0", "config.yaml").is_file()
    rechecked = yaml.safe_load(Path(tmp_path, "tune", "recheck-0", "config.yaml").read_text())
    assert rechecked["model"]["seed"] == 1 and rechecked["train"]["shuffle_seed"] == 1
    tuned = yaml.safe_load(Path(tmp_path, "tuned.yaml").read_text())
    assert tuned["tuned_at"]["world_size"] == 1
    # the pipeline's own value of each key the tune set (trial 0's settings)
    assert tuned["tuned_at"]["pipeline"]["meta.inner_steps"] == 1
    assert {"inner_steps", "inner_lr", "learn_inner_lr"} <= set(tuned["meta"])
    assert {"baseline_lr", "baseline_steps"} <= set(tuned["eval"])
    config = load_config("default", overrides)
    assert config.meta.inner_lr == tuned["meta"]["inner_lr"]
    assert config.train.baseline_learning_rate == tuned["train"]["baseline_learning_rate"]
    # The trials' checkpoints are gone (only their scores are kept), the cold split unread.
    assert not list(Path(tmp_path, "tune").glob("trial-*/checkpoints"))
    # Training at another world size than the trials ran at says so.
    tuned["tuned_at"]["world_size"] = 2
    Path(tmp_path, "tuned.yaml").write_text(yaml.safe_dump(tuned))
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("gmeta_tf.training.trainer").addHandler(handler)  # main() set up logging
    try:
        Trainer(load_config("default", overrides + ["train.steps=2"]), fresh=True).run()
    finally:
        logging.getLogger("gmeta_tf.training.trainer").removeHandler(handler)
    assert any("were tuned at 2 rank(s) and train at 1" in w for w in warnings), warnings


def test_validation_adapts_the_model_as_gmeta_eval_does(tiny_data, tmp_path):
    """``eval.adapt_steps`` sets the meta model's adaptation steps for validation too, so
    the checkpoint chosen is the best under the adaptation that gmeta eval scores."""
    from gmeta_tf.training.evaluation import Validator, meta_predict, report, score_tasks
    from gmeta_tf.training.model_builder import build_models

    overrides = tiny_overrides(tmp_path, tiny_data) + ["train.eval_batches=2"]
    config = load_config("default", overrides + ["eval.adapt_steps=0"])
    models = build_models(config)
    validator = Validator(models, config)
    batches = [b for b, _ in validator._load()[0]]
    scores = {steps: report(score_tasks(meta_predict(models.model, steps), batches,
                                        validator.labels), validator.kind, validator.k)
              .overall for steps in (0, None)}
    assert abs(scores[0]["logloss"] - scores[None]["logloss"]) > 1e-4
    validated = validator()["model"]
    for metric in ("auc", "logloss"):
        assert validated[metric] == pytest.approx(scores[0][metric], rel=1e-6)


def test_validation_scores_each_task_under_several_splits_of_its_rows(tiny_data, tmp_path):
    """``train.valid_resplits``: split 0 is the protocol's (what one split scores), the
    others hold the same tasks in the same order, each with the same rows and the same
    number of query rows but other query rows; each metric is the mean over the splits."""
    import numpy as np

    from gmeta_tf.training.evaluation import Validator, report, score_task_outputs
    from gmeta_tf.training.model_builder import build_models

    def rows_of(batches, role):
        out = []
        for batch, real in batches:
            assert real
            part = batch[role]
            names = sorted(k for k in part if k != "mask")
            mask = np.asarray(part["mask"]) > 0
            for t, task in enumerate(np.asarray(batch["task_id"])):
                rows = zip(*(np.asarray(part[n])[t][mask[t]].reshape(int(mask[t].sum()), -1)
                             .tolist() for n in names))
                out.append((int(task), sorted(map(str, rows))))
        return out

    overrides = tiny_overrides(tmp_path, tiny_data) + ["train.eval_batches=2"]
    config = load_config("default", overrides + ["train.valid_resplits=3"])
    models = build_models(config)
    validator = Validator(models, config)
    splits = validator._load()
    protocol = Validator(models, load_config("default", overrides))._load()
    assert len(splits) == 3 and len(protocol) == 1
    assert rows_of(splits[0], "query") == rows_of(protocol[0], "query")
    first_query = rows_of(splits[0], "query")
    first_all = [(t, sorted(q + s)) for (t, q), (_, s)
                 in zip(first_query, rows_of(splits[0], "support"))]
    for other in splits[1:]:
        query = rows_of(other, "query")
        assert [t for t, _ in query] == [t for t, _ in first_query]
        assert [len(q) for _, q in query] == [len(q) for _, q in first_query]
        assert [(t, sorted(q + s)) for (t, q), (_, s)
                in zip(query, rows_of(other, "support"))] == first_all
        assert sum(q != f for (_, q), (_, f) in zip(query, first_query)) > len(query) // 2
    assert rows_of(splits[1], "query") != rows_of(splits[2], "query")

    results = validator()
    assert set(results) == {"model", "baseline"}
    predict = validator.predictors["model"]
    per_split = [report(score_task_outputs(predict, [b for b, _ in batches],
                                           validator.labels)["prediction"],
                        validator.kind, validator.k).overall for batches in splits]
    for metric in ("auc", "logloss"):
        assert results["model"][metric] == pytest.approx(
            np.mean([r[metric] for r in per_split]), rel=1e-6)
    assert results["model"]["tasks"] == per_split[0]["tasks"]
    assert results["model"]["rows"] == sum(r["rows"] for r in per_split)


def test_gmeta_tune_scores_the_baseline_when_the_meta_model_diverges_at_once(
        tiny_data, tmp_path, monkeypatch):
    """A meta setting whose loss is not finite before the first validation fails its own
    study's trial only: the baseline trains on in the same run and its setting is scored,
    so the baseline's study keeps its every trial."""
    import optuna

    from gmeta_tf.training import tuning

    searched = tuning._meta_space

    def diverging_first_trial(trial, config):
        settings = searched(trial, config)
        if isinstance(trial, optuna.trial.Trial) and trial.number == 0:
            settings["train.learning_rate"] = 1e12
        return settings

    monkeypatch.setattr(tuning, "_meta_space", diverging_first_trial)
    overrides = tiny_overrides(tmp_path, tiny_data, steps=8) + [
        "train.eval_every=4", "train.log_every=1"]
    tuning.tune("default", overrides, trials=2, patience=1, rechecks=0)
    trials = json.loads(Path(tmp_path, "tune", "trials.json").read_text())["trials"]
    first = trials[0]
    assert first["settings"]["model"]["train.learning_rate"] == 1e12
    assert set(first["values"]) == {"baseline"} and math.isfinite(first["values"]["baseline"])
    assert first["status"].startswith("ok; not finite (training diverged): the model at step ")
    assert first["best_steps"]["baseline"] in (4, 8)
    assert not Path(tmp_path, "tune", "trial-0", "checkpoints.initial").exists()
    assert set(trials[1]["values"]) == {"model", "baseline"}


@pytest.mark.parametrize("summary, expected", [
    ({"final_loss": 0.25, "baseline_loss": 0.5}, (0.25, 0.5)),
    ({"final_loss": "0.25", "baseline_loss": None}, (1.0, 2.0)),   # not numbers: ignored
    ({"final_loss": True, "baseline_loss": [0.5]}, (1.0, 2.0)),
    ([0.25, 0.5], (1.0, 2.0)),                                      # not a summary at all
])
def test_a_resume_with_nothing_to_train_reads_only_numbers_from_the_previous_summary(
        tmp_path, summary, expected):
    config = load_config("default", [f"run_dir={tmp_path}"])
    Path(tmp_path, SUMMARY_FILE).write_text(json.dumps(summary))
    assert Trainer(config)._previous_losses(1.0, 2.0) == expected
