"""``gmeta tune``: choose a pipeline's settings on its own validation split (Optuna).

Two studies run side by side with the same number of trials: one searches the meta
model's settings, the other the baseline's, so neither contender gets a larger tuning
budget. Each trial is one ``gmeta train`` run (a child process: a failed or diverged trial
costs only itself) in ``<run_dir>/tune/trial-<n>``, training the meta model and the
baseline beside it on the same batches; each model is scored on the validation split
every ``train.eval_every`` steps and its best score (``train.select_metric``) is its
trial's value, with early stopping (``--patience``): each model stops training on its
own count, so a trial's two models never move each other's values. The cold split is
never read.

Each study's first trial is the pipeline's own settings. A single trial's best
validation score is noisy, and an unstable setting can win one run by luck, so the best
``rechecks`` settings of each study, and the pipeline's own settings when they are not
among them (the incumbent, ``recheck_picks``), are trained once more with other initial
weights and another batch order (``model.seed`` and ``train.shuffle_seed`` + 1; re-check
i pairs the meta model's i-th pick with the baseline's i-th, so both studies get the same
number of re-checks) and each study's choice is the setting with the best mean of its
two runs, unless that beats the pipeline's own settings by no more than one standard error
of the difference (``choose_setting``): then the pipeline's own settings stay.
A model whose loss is not finite stops training while the other trains on
(``gmeta_tf.training.trainer``), so one study's diverging setting never costs the other
study its trial.
Trials run at ``--np`` ranks: the batch of a step is ``data.tasks_per_batch`` per rank, so
tune at the world size you will train at (``tuned.yaml`` records it and ``gmeta train``
warns when it differs). Search spaces (ranges below): the meta model's inner steps k, inner
rate, learned inner rates (none, per tensor, per element, each optionally per step:
Meta-SGD / MAML++), multi-step loss, outer learning rate, pre-training steps
(``train.pretrain_steps``), its tables' learning rate (one for every table), the weight
of its embedding rows' L2 penalty (``train.embedding_l2``) and, for a
MeLU rating model, the ridge strength of its output layer (``meta.ridge``, 0 = off; its
weights on a factor prior's factors and its bias keep the prior's fold-in strength); the
baseline's learning rate, its tables' learning rate
(``train.baseline_table_learning_rate``), its embedding penalty
(``train.baseline_embedding_l2``, the same choices), fine-tuning rate and fine-tuning steps
(the same range as k) and its own ridge strength (``eval.baseline_ridge``). A study's first
trial gives every table the rate most of them share (``pipeline_table_rate``). A plain
CTR pipeline (``meta.enabled: false``) searches its learning rate, its tables' learning
rate, its batch size and its embedding width.

A factor prior's settings that the pipeline leaves unset (``model.prior.damping``,
``item_bias``, ``fold_in_prior``, ``fold_in``) depend on no searched setting: they are
chosen once before the trials (``prior_fit.chosen_factor_settings``, on the validation
split and training tasks held out in turn), given to every trial and written with the
rest.

The chosen settings are written to ``<run_dir>/tuned.yaml``, which ``gmeta train``,
``eval`` and ``export`` of that pipeline apply (below any ``--set``); every trial goes to
``<run_dir>/tune/trials.json`` as it ends, with what defines the study (the pipeline,
``--set``, seed, ranks, patience). ``resume=True`` (``gmeta tune --resume``) continues a
study that was stopped: the samplers are asked again in order, as the first run asked
them, and each trial (and re-check) recorded with the very settings asked now takes its
recorded scores instead of training again, so the study ends where an uninterrupted one
would, with as many trials as the new ``--trials`` asks (no fewer than recorded); a
study defined otherwise (the config's contents, the dataset's files, the metric, ...) is
refused, before the factor prior is fitted. Without it, an earlier study in
``<run_dir>/tune`` (its record, its trials' configs and logs) is renamed whole to
``tune.previous-<time>`` before the new study writes anything, and the new study's record
is written at once, so a study stopped before its first trial ends resumes too. Before
any trial the pipeline's dataset is made (or the
one there checked) and the config checked against it, as ``gmeta train`` does; a first
trial (the pipeline's own settings) that fails stops the study with its error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from gmeta_tf.atomic_file import write_text_atomically
from gmeta_tf.config import (ABSENT, TUNED_AT_KEY, TUNED_FILE, ConfigError, PipelineConfig,
                             baseline_embedding_l2, dotted_value, load_config,
                             override_value, ridge_applies)
from gmeta_tf.training.evaluation import (HIGHER_IS_BETTER, baseline_ridge, baseline_steps,
                                         selection_metric)
from gmeta_tf.training.prior_fit import chosen_factor_settings

log = logging.getLogger(__name__)
MULTI_STEP_LOSS = [0, 100, 200, 300]
RIDGE = [0.0, 1.0, 3.0, 10.0, 30.0, 100.0]  # ridge strengths of the output layer (0: off)
EMBEDDING_L2 = [0.0, 0.01, 0.1]  # weights of the embedding rows' L2 penalty (0: off)
BATCH_SIZES = [64, 128, 256, 512]
EMBEDDING_DIMS = [4, 8, 16]
TABLE_RATES = (1e-3, 0.3)  # the range of a model's table learning rate (every table's)
INNER_RATE_MODES = {  # learn_inner_lr, inner_lr_per_element, inner_lr_per_step
    "fixed": (False, False, False), "per_tensor": (True, False, False),
    "per_element": (True, True, False), "per_tensor_per_step": (True, False, True),
    "per_element_per_step": (True, True, True)}


def _meta_space(trial, config: PipelineConfig) -> dict[str, Any]:
    mode = trial.suggest_categorical("inner_rates", list(INNER_RATE_MODES))
    learn, per_element, per_step = INNER_RATE_MODES[mode]
    settings = {
        "meta.inner_steps": trial.suggest_int("inner_steps", 1, 5),
        "meta.inner_lr": trial.suggest_float("inner_lr", 1e-3, 3.0, log=True),
        "meta.learn_inner_lr": learn, "meta.inner_lr_per_element": per_element,
        "meta.inner_lr_per_step": per_step,
        "train.learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True),
        "train.pretrain_steps": trial.suggest_categorical("pretrain_steps",
                                                          pretrain_choices(config)),
        "train.embedding_l2": trial.suggest_categorical("embedding_l2", EMBEDDING_L2),
        **_table_rates(trial, config),
    }
    if config.meta.algorithm != "reptile":
        settings["meta.multi_step_loss"] = trial.suggest_categorical("multi_step_loss",
                                                                     MULTI_STEP_LOSS)
    if ridge_applies(config.model):
        settings["meta.ridge"] = trial.suggest_categorical("ridge", RIDGE)
    return settings


def pretrain_choices(config: PipelineConfig) -> list[int]:
    """Pre-training lengths searched: none, or a tenth, a fifth or two fifths of
    ``train.steps`` (early stopping ends a run where it stops improving anyway)."""
    steps = config.train.steps
    return sorted({0, steps // 10, steps // 5, 2 * steps // 5})


def _baseline_space(trial, config: PipelineConfig) -> dict[str, Any]:
    settings = {
        "train.baseline_learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-2,
                                                            log=True),
        "eval.baseline_lr": trial.suggest_float("fine_tune_lr", 1e-3, 3.0, log=True),
        "eval.baseline_steps": trial.suggest_int("fine_tune_steps", 1, 5),
        "train.baseline_table_learning_rate": _suggest_table_rate(trial),
        "train.baseline_embedding_l2": trial.suggest_categorical("embedding_l2", EMBEDDING_L2),
    }
    if ridge_applies(config.model):
        settings["eval.baseline_ridge"] = trial.suggest_categorical("ridge", RIDGE)
    return settings


def _ctr_space(trial, config: PipelineConfig) -> dict[str, Any]:
    settings = {
        "train.learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True),
        "data.batch_size": trial.suggest_categorical("batch_size", BATCH_SIZES),
        "model.embedding_dim": trial.suggest_categorical("embedding_dim", EMBEDDING_DIMS),
    }
    settings.update(_table_rates(trial, config))
    return settings


def _table_rates(trial, config: PipelineConfig) -> dict[str, float]:
    """One learning rate for every table of the model (the baseline's study searches its
    own, ``train.baseline_table_learning_rate``). How fast an id's row learns from its
    few rows matters most where ids are rare (a catalogue of many items with few ratings
    each): on such data the best rate of MovieLens 100K was a poor one for the baseline
    (``benchmarks.cold_start --split-items``)."""
    rate = _suggest_table_rate(trial)
    return {f"model.tables.{table}.learning_rate": rate for table in config.model.tables}


def _suggest_table_rate(trial) -> float:
    """A study's table learning rate: one name and range for all three studies."""
    return trial.suggest_float("table_learning_rate", *TABLE_RATES, log=True)


def pipeline_table_rate(config: PipelineConfig) -> float:
    """The pipeline's table learning rate as the one rate a study searches: the rate most
    of its tables share (the first such table's on a tie). Taking the first table's rate
    instead gave a pipeline whose first table never stores a row, left at the default
    rate, that rate for every table: a first trial far below the pipeline's own settings."""
    rates = [t.optimizer.learning_rate for t in config.model.tables.values()]
    return max(rates, key=rates.count)  # the first of the most common


def tables_at_another_rate(config: PipelineConfig) -> dict[str, float]:
    """The tables whose rate is not ``pipeline_table_rate``: the first trial gives them that
    rate too, so the pipeline's own settings are then not exactly its first trial."""
    rate = pipeline_table_rate(config)
    return {name: t.optimizer.learning_rate for name, t in config.model.tables.items()
            if t.optimizer.learning_rate != rate}


def _nearest(value, choices):
    return min(choices, key=lambda c: abs(c - value))


def _clip(value: float, low: float, high: float) -> float:
    return float(min(max(value, low), high))


def pipeline_params(name: str, config: PipelineConfig) -> dict[str, Any]:
    """The pipeline's own settings as a study's parameters: every study's first trial, so
    tuning never ends worse on validation than the settings it started from."""
    m, t, e = config.meta, config.train, config.eval
    if name == "model" and config.meta.enabled:
        mode = next(k for k, v in INNER_RATE_MODES.items()
                    if v == (m.learn_inner_lr, m.learn_inner_lr and m.inner_lr_per_element,
                             m.learn_inner_lr and m.inner_lr_per_step))
        params = {"inner_rates": mode, "inner_steps": min(max(m.inner_steps, 1), 5),
                  "inner_lr": _clip(m.inner_lr, 1e-3, 3.0),
                  "learning_rate": _clip(t.learning_rate, 1e-4, 1e-2),
                  "pretrain_steps": _nearest(t.pretrain_steps, pretrain_choices(config)),
                  "embedding_l2": _nearest(t.embedding_l2, EMBEDDING_L2),
                  "table_learning_rate": _clip(pipeline_table_rate(config), *TABLE_RATES)}
        if m.algorithm != "reptile":
            params["multi_step_loss"] = _nearest(m.multi_step_loss, MULTI_STEP_LOSS)
        if ridge_applies(config.model):
            params["ridge"] = _nearest(m.ridge, RIDGE)
        return params
    if name == "baseline":
        steps = baseline_steps(config)
        params = {"learning_rate": _clip(t.baseline_learning_rate or t.learning_rate,
                                         1e-4, 1e-2),
                  "fine_tune_lr": _clip(e.baseline_lr, 1e-3, 3.0),
                  "fine_tune_steps": min(max(steps, 1), 5),
                  "table_learning_rate": _clip(t.baseline_table_learning_rate
                                               or pipeline_table_rate(config), *TABLE_RATES),
                  "embedding_l2": _nearest(baseline_embedding_l2(config), EMBEDDING_L2)}
        if ridge_applies(config.model):
            params["ridge"] = _nearest(baseline_ridge(config), RIDGE)
        return params
    return {"learning_rate": _clip(t.learning_rate, 1e-4, 1e-2),
            "batch_size": _nearest(config.data.batch_size, BATCH_SIZES),
            "table_learning_rate": _clip(pipeline_table_rate(config), *TABLE_RATES),
            "embedding_dim": _nearest(config.model.embedding_dim, EMBEDDING_DIMS)}


#: The searched keys per study (documentation; the functions above define the ranges).
SEARCH_SPACE: dict[str, Callable] = {"model": _meta_space, "baseline": _baseline_space,
                                     "ctr": _ctr_space}


@dataclasses.dataclass
class TrialResult:
    number: int
    settings: dict[str, dict[str, Any]]
    values: dict[str, float]
    best_steps: dict[str, int]
    status: str


def _train_command(config_arg: str, overrides: list[str], np_: int) -> list[str]:
    command = [sys.executable, "-m", "gmeta_tf.cli", "train", "--config", config_arg, "--fresh"]
    for item in overrides:
        command += ["--set", item]
    if np_ > 1:
        from gmeta_tf.launcher import horovodrun

        command = [*horovodrun(), "-np", str(np_), "-H", f"localhost:{np_}",
                   "--gloo-timeout-seconds", "120", *command]
    return command


def run_trial(config_arg: str, base_overrides: list[str], trial_dir: Path,
              settings: dict[str, Any], np_: int, patience: int) -> tuple[dict, dict, str]:
    """Trains one trial as a child process; returns (values, best steps, status)."""
    if trial_dir.exists():
        shutil.rmtree(trial_dir)
    overrides = list(base_overrides) + [
        f"run_dir={trial_dir}", f"train.patience={patience}", "train.keep_checkpoints=1"]
    overrides += [f"{k}={override_value(v)}" for k, v in settings.items()]
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    trial_dir.mkdir(parents=True)
    with open(trial_dir / "train.log", "w") as out:
        code = subprocess.run(_train_command(config_arg, overrides, np_), stdout=out,
                              stderr=subprocess.STDOUT, env=env).returncode
    best_file = trial_dir / "checkpoints" / "BEST.json"
    if code != 0 or not best_file.is_file():
        text = (trial_dir / "train.log").read_text(errors="replace")
        return {}, {}, f"failed (exit {code}): {trial_errors(text) or text[-600:]}"
    best = json.loads(best_file.read_text())["best"]
    values = {n: float(b["value"]) for n, b in best.items()}
    steps = {n: int(b["step"]) for n, b in best.items()}
    # Only the scores are kept: the trial's checkpoints are not needed any more.
    shutil.rmtree(trial_dir / "checkpoints", ignore_errors=True)
    try:
        diverged = json.loads((trial_dir / "train_summary.json").read_text())["diverged_at"]
    except (OSError, ValueError, KeyError, TypeError):
        diverged = {}
    if diverged:
        return values, steps, "ok; not finite (training diverged): " + ", ".join(
            f"the {n} at step {step}" for n, step in sorted(diverged.items()))
    return values, steps, "ok"


class _Record:
    """The trials and re-checks of an earlier run of the same study (``--resume``), each
    taken once, in order, where the study asks for the very settings it recorded."""

    def __init__(self, path: Path, study: dict, resume: bool, trials: int) -> None:
        self.path, self.trials, self.rechecks, self.count = path, [], [], 0
        self.asked = trials
        self.study = {}
        if not resume or not path.is_file():
            return
        try:
            recorded = json.loads(path.read_text())
            results = [TrialResult(**r) for r in recorded["trials"]]
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"gmeta tune --resume: {path} is not a trials record this "
                              f"version wrote ({e}); start the study anew without --resume") from e
        if "study" not in recorded:
            raise ConfigError(f"gmeta tune --resume: {path} was written before studies "
                              f"could be resumed (it does not say what defined its study); "
                              f"start the study anew without --resume")
        self.study = recorded["study"]
        for key, value in study.items():
            self.check(key, value)
        self.count = int(recorded.get("trials_asked", 0))
        if trials < self.count:
            raise ConfigError(f"gmeta tune --resume --trials {trials}: the study recorded in "
                              f"{path} asks for {self.count} trials; resume it with --trials "
                              f"{self.count} or more")
        self.trials = [r for r in results if r.number < self.count]
        self.rechecks = [r for r in results if r.number >= self.count]
        log.info("gmeta tune --resume: %d trials and %d re-checks recorded in %s",
                 len(self.trials), len(self.rechecks), path)

    def check(self, key: str, value: Any) -> None:
        """Refuses to resume a study recorded with another ``key`` (nothing to check
        without a record)."""
        if not self.study or self.study.get(key) == value:
            return
        shown = {"pipeline": "the checked config (a file edited since?)",
                 "dataset": "the dataset's files (made again since?)"}
        raise ConfigError(
            f"gmeta tune --resume: the study recorded in {self.path} had another {key}"
            + (f" ({shown[key]})" if key in shown else
               f": {self.study.get(key)!r}, this one {value!r}")
            + ": a study resumes only as it began (start it anew without --resume)")

    def trial(self, number: int, settings: dict) -> TrialResult | None:
        if number >= len(self.trials):
            return None
        recorded = self.trials[number]
        if _plain(recorded.settings) != _plain(settings):
            raise ConfigError(
                f"gmeta tune --resume: trial {number} recorded in {self.path} had "
                f"settings {recorded.settings}, the study now asks {settings} (Optuna or "
                f"the search space changed): start the study anew without --resume")
        return recorded

    def recheck(self, index: int, settings: dict) -> TrialResult | None:
        if self.count != self.asked or index >= len(self.rechecks):
            return None  # re-checks follow from every trial: only the same study's count
        recorded = self.rechecks[index]
        return recorded if _plain(recorded.settings) == _plain(settings) else None


def _set_aside_earlier_study(root: Path) -> None:
    """A new study's trials go to an empty ``root``: an earlier study there (its record,
    its trials' configs and logs) is renamed to ``tune.previous-<time>`` beside it, whole,
    before the new one writes anything."""
    if not root.is_dir() or not any(root.iterdir()):
        return
    record = root / "trials.json"
    stamp = int((record if record.is_file() else root).stat().st_mtime)
    kept = root.with_name(f"{root.name}.previous-{stamp}")
    n = 1
    while kept.exists():
        kept, n = root.with_name(f"{root.name}.previous-{stamp}-{n}"), n + 1
    os.replace(root, kept)
    chosen = root.parent / TUNED_FILE
    if chosen.is_file():  # the settings it chose, which this study's will replace
        shutil.copy2(chosen, kept / TUNED_FILE)
    log.info("gmeta tune: %s holds an earlier study, kept whole as %s with the %s it chose "
             "(--resume continues a stopped study instead)", root, kept, TUNED_FILE)


def _plain(value: Any) -> Any:
    """``value`` as JSON gives it back: the form recorded settings are compared in."""
    return json.loads(json.dumps(value, default=str))


def tune(config_arg: str, overrides: list[str], trials: int, np_: int = 1,
         patience: int = 3, seed: int = 0, rechecks: int = 2, resume: bool = False) -> dict:
    """Runs the studies and writes ``tuned.yaml``; returns the summary.

    Args:
        config_arg: The pipeline (file or ready name), as ``gmeta train`` takes it.
        overrides: ``--set`` overrides of the pipeline, applied to every trial.
        trials: Trials per study (each trial trains every contender once).
        np_: Ranks per trial (horovodrun for more than one).
        patience: Early-stopping patience of each trial, in evaluations.
        seed: Seed of the samplers.
        rechecks: How many of each study's best settings are trained again with other
            seeds before choosing, besides the pipeline's own (0: choose on the single
            runs).
        resume: Continue the study recorded in ``<run_dir>/tune/trials.json``: its
            trials take their recorded scores (``_Record``).
    """
    import optuna

    config = load_config(config_arg, overrides, tuned=False)
    if not config.train.eval_every:
        raise ConfigError("config key 'train.eval_every' = 0 is not allowed for gmeta tune: "
                          "expected > 0 (trials are scored on the validation split)")
    metric = selection_metric(config)
    direction = "maximize" if metric.split("@")[0] in HIGHER_IS_BETTER else "minimize"
    if config.meta.enabled:
        spaces = {"model": _meta_space}
        if config.train.baseline:
            spaces["baseline"] = _baseline_space
    else:
        spaces = {"model": _ctr_space}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    studies = {name: optuna.create_study(direction=direction, study_name=name,
                                         sampler=optuna.samplers.TPESampler(seed=seed + i))
               for i, name in enumerate(spaces)}
    differ = tables_at_another_rate(config)
    if differ:
        log.warning("gmeta tune searches one learning rate for every table; the first trial "
                    "gives every table %g, the rate of most of them, so these tables train "
                    "at another rate than the pipeline gives them: %s",
                    pipeline_table_rate(config),
                    ", ".join(f"{n} ({r:g})" for n, r in sorted(differ.items())))
    for name, study in studies.items():
        study.enqueue_trial(pipeline_params(name if config.meta.enabled else "ctr", config))
    root = Path(config.run_dir) / "tune"
    dataset = check_data(config, np_)
    study_key = {"config": config_arg, "overrides": list(overrides), "seed": seed,
                 "world_size": np_, "patience": patience, "metric": metric,
                 "pipeline": _digest(dataclasses.asdict(config)), "dataset": dataset}
    # a study resumed otherwise than it began is refused before the prior's fit
    record = _Record(root / "trials.json", study_key, resume, trials)
    # the factor prior's settings do not depend on any searched one: chosen once, here
    prior = chosen_factor_settings(config)
    study_key["prior"] = _plain(prior)
    record.check("prior", study_key["prior"])
    if not resume:
        _set_aside_earlier_study(root)
    # every trial reads the dataset converted (and its files checked, check_data) here,
    # whatever its own run directory
    overrides = [*overrides, f"data.path={config.data.path}", "data.verify=size",
                 *(f"{key}={value}" for key, value in prior.items())]
    root.mkdir(parents=True, exist_ok=True)
    if not resume:  # this study's record from the start: --resume finds it, trials or none
        _write_trials(root / "trials.json", metric, [], study_key, trials)
    results: list[TrialResult] = []
    write = lambda: _write_trials(root / "trials.json", metric, results,  # noqa: E731
                                  study_key, trials)
    for number in range(trials):
        asked = {name: study.ask() for name, study in studies.items()}
        settings = {name: spaces[name](trial, config) for name, trial in asked.items()}
        merged = {k: v for s in settings.values() for k, v in s.items()}
        recorded = record.trial(number, settings)
        if recorded is not None:
            log.info("trial %d (%d of %d): recorded: %s", number, number + 1, trials, merged)
            values, steps, status = recorded.values, recorded.best_steps, recorded.status
        else:
            log.info("trial %d (%d of %d, in %s): %s", number, number + 1, trials,
                     root / f"trial-{number}", merged)
            values, steps, status = run_trial(config_arg, overrides,
                                              root / f"trial-{number}", merged, np_, patience)
        for name, study in studies.items():
            value = values.get(name)
            if value is None or math.isnan(value):
                study.tell(asked[name], state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(asked[name], value)
        results.append(TrialResult(number, settings, values, steps, status))
        log.info("trial %d: %s validation %s %s", number, status, metric,
                 {n: round(v, 4) for n, v in values.items()})
        write()
        if number == 0 and not values:
            raise ConfigError(f"gmeta tune: the first trial, the pipeline's own settings, "
                              f"{status} (its log: {root / 'trial-0' / 'train.log'}); a "
                              f"pipeline must train as it is before it is tuned")
    maximize = direction == "maximize"
    ranked = {}
    for name, study in studies.items():
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        if not done:
            raise ConfigError(f"gmeta tune: every trial of the {name} failed; see "
                              f"{root}/trial-*/train.log")
        ranked[name] = [t.number for t in sorted(done, key=lambda t: t.value,
                                                 reverse=maximize)]
        if len(done) > 1 and len({round(t.value, 10) for t in done}) == 1:
            steps = {results[t.number].best_steps.get(name) for t in done}
            log.warning("gmeta tune: every completed trial of the %s scored the same validation "
                        "%s, %.4f%s: the search cannot tell its settings apart on this "
                        "validation split, and the pipeline's own (trial 0) are kept", name,
                        metric, done[0].value,
                        " (each kept its checkpoint of step 0, the linear start)"
                        if steps == {0} else "")
    rechecked = _recheck(config_arg, overrides, config, root, results, ranked, rechecks,
                         np_, patience, write, record.recheck)
    chosen = {}
    for name in studies:
        runs = {n: [results[n].values[name], *rechecked.get((name, n), [])]
                for n in ranked[name]}
        candidates = [n for n in ranked[name] if (name, n) in rechecked] or ranked[name][:1]
        number, margin = choose_setting({n: runs[n] for n in candidates}, maximize)
        best = results[number]
        chosen[name] = {"trial": number, "value": best.values[name],
                        "mean_with_recheck": _mean(runs[number], maximize),
                        "incumbent_margin": margin,
                        "best_step": best.best_steps.get(name), "settings": best.settings[name]}
    summary = {"metric": metric, "trials": trials, "rechecks": rechecks, "chosen": chosen,
               "split": config.train.validation_split, "world_size": np_, "prior": prior}
    write_tuned(config, summary)
    from gmeta_tf import checkpoint

    if checkpoint.latest(config.checkpoint_dir) is not None:
        log.warning("gmeta tune: %s holds checkpoints trained before these settings were "
                    "chosen; gmeta train --fresh trains under them (gmeta eval and export "
                    "would read the old checkpoints with the new settings)",
                    config.checkpoint_dir)
    return summary


def check_data(config: PipelineConfig, np_: int) -> str:
    """Makes the pipeline's dataset (or checks the one there) and checks the config against
    it, as ``gmeta train`` does, once before any trial: a dataset that does not fit stops
    the study with its own message instead of failing every trial. Returns a digest of
    the dataset's files (their checksums), which a resumed study must find again."""
    from gmeta_tf.training.config_check import check_against_dataset, check_data_files
    from gmeta_tf.training.dataset_prep import prepare_dataset

    manifest = prepare_dataset(config, world_size=np_)
    check_against_dataset(config, manifest, training=True, eval_split=False)
    # the files' bytes against their checksums once here (data.verify), not in every trial
    check_data_files(config, config.data.path, ["warm", config.train.validation_split])
    return _digest(sorted((f.path, f.sha256) for f in manifest.files))


def _digest(value: Any) -> str:
    """A short SHA-256 of ``value`` as JSON (keys sorted; other objects by their repr)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def trial_errors(log_text: str) -> str:
    """The ``gmeta: error:`` messages of a failed trial's log (every rank's), each once, in
    order; empty when it has none (a crash: its log's tail says more)."""
    found = []
    for line in log_text.splitlines():
        message = line.partition("gmeta: error: ")[2].strip()
        if message and message not in found:
            found.append(message)
    return "; ".join(found)


def _mean(values: list[float], maximize: bool) -> float:
    """A setting's mean over its runs; a run that was not finite counts as the worst."""
    worst = -math.inf if maximize else math.inf
    values = [v if math.isfinite(v) else worst for v in values]
    return sum(values) / len(values)


def choose_setting(runs: dict[int, list[float]], maximize: bool,
                   incumbent: int = 0) -> tuple[int, float | None]:
    """The study's choice among its re-checked settings (trial number -> its runs' values)
    and the margin a challenger had to beat (None when the incumbent was not a candidate).

    The best mean wins, unless the incumbent (the pipeline's own settings, trial 0) is a
    candidate and the best challenger beats it by no more than one standard error of the
    difference of their means: the run-to-run spread is pooled over every candidate with
    more than one finite run (each re-checked setting's runs differ only in their seeds),
    and the standard error is that spread times sqrt(1/n_challenger + 1/n_incumbent). The
    best of a few noisy means is biased upward (the winner's curse), so a challenger inside
    the noise replaces the settings a user started from only by luck: the one-standard-error
    rule (Breiman et al. 1984; Hastie et al., The Elements of Statistical Learning, 7.10).
    Both studies choose by this same rule. Without a repeat run the spread is unknown and
    the best mean wins.
    """
    means = {n: _mean(v, maximize) for n, v in runs.items()}
    pick = (max if maximize else min)(means, key=lambda n: means[n])
    if incumbent not in runs or pick == incumbent or not math.isfinite(means[incumbent]):
        return pick, None
    squares, dof = 0.0, 0
    for values in runs.values():
        finite = [v for v in values if math.isfinite(v)]
        if len(finite) > 1:
            centre = sum(finite) / len(finite)
            squares += sum((v - centre) ** 2 for v in finite)
            dof += len(finite) - 1
    if dof == 0:
        return pick, None
    margin = math.sqrt(squares / dof) * math.sqrt(1 / len(runs[pick]) + 1 / len(runs[incumbent]))
    gain = means[pick] - means[incumbent] if maximize else means[incumbent] - means[pick]
    return (pick if gain > margin else incumbent), margin


def _recheck(config_arg: str, overrides: list[str], config: PipelineConfig, root: Path,
             results: list[TrialResult], ranked: dict[str, list[int]], rechecks: int, np_: int,
             patience: int, write: Callable[[], None],
             recorded: Callable[[int, dict], TrialResult | None] = lambda i, s: None,
             ) -> dict[tuple[str, int], list[float]]:
    """Trains each study's best settings again with other seeds: (study, trial) -> values.
    ``write`` records ``results`` after each; ``recorded(i, settings)``: re-check i's
    recorded result, when a resumed study recorded it with these settings."""
    lists = recheck_picks(ranked, rechecks)
    # Every study's picks are re-checked, its own settings (the last pick) included: a
    # study with fewer completed trials than the other's picks trains its best beside
    # them, unrecorded (a repeat at the same seeds would count one run twice).
    count = max([len(numbers) for numbers in lists.values()], default=0)
    seeds = [f"model.seed={config.model.seed + 1}",
             f"train.shuffle_seed={config.train.shuffle_seed + 1}"]
    if count:
        log.info("re-checks (--rechecks %d): each study's %d best settings and the pipeline's "
                 "own, trained again with other seeds: %d runs", rechecks, rechecks, count)
    out: dict[tuple[str, int], list[float]] = {}
    for i in range(count):
        picks = {name: numbers[i] for name, numbers in lists.items() if i < len(numbers)}
        settings = {name: results[numbers[i] if i < len(numbers) else ranked[name][0]]
                    .settings[name] for name, numbers in lists.items()}
        merged = {k: v for s in settings.values() for k, v in s.items()}
        log.info("re-check %d (%d of %d) with other seeds: %s", i, i + 1, count,
                 {name: f"trial {n}" for name, n in picks.items()})
        done = recorded(i, settings)
        if done is not None:
            values, steps, status = done.values, done.best_steps, done.status
            log.info("re-check %d: recorded", i)
        else:
            values, steps, status = run_trial(config_arg, list(overrides) + seeds,
                                              root / f"recheck-{i}", merged, np_, patience)
            status = f"{status} (re-check of {picks})"
        for name, n in picks.items():
            out.setdefault((name, n), []).append(values.get(name, math.nan))
        results.append(TrialResult(len(results), settings, values, steps, status))
        log.info("re-check %d: %s validation %s", i, status,
                 {n: round(v, 4) for n, v in values.items()})
        write()
    return out


def recheck_picks(ranked: dict[str, list[int]], rechecks: int) -> dict[str, list[int]]:
    """The trials each study re-checks, in order: its ``rechecks`` best, then the
    pipeline's own settings (trial 0, the incumbent) when they are not among them, so a
    setting replaces them only on the mean of two runs against two, never on one lucky run
    (a challenger must beat the incumbent on as many runs: SMAC's intensification, Hutter
    et al. 2011). Re-check i trains the studies' i-th picks together, so a study with
    fewer picks takes its next best trials: both get the same number of re-checks."""
    if rechecks <= 0:
        return {name: [] for name in ranked}
    lists = {}
    for name, numbers in ranked.items():
        picks = list(numbers[:rechecks])
        if 0 in numbers and 0 not in picks:
            picks.append(0)
        lists[name] = picks
    count = max(len(p) for p in lists.values())
    for name, picks in lists.items():
        picks += [n for n in ranked[name] if n not in picks][:count - len(picks)]
    return lists


def _write_trials(path: Path, metric: str, results: list[TrialResult], study: dict,
                  trials: int) -> None:
    """The study's record: what defines it, the trials it asks for, and every trial and
    re-check so far (re-checks numbered from ``trials`` on)."""
    text = json.dumps({"metric": metric, "study": study, "trials_asked": trials,
                       "trials": [dataclasses.asdict(r) for r in results]},
                      indent=1, default=str)
    write_text_atomically(path, text)


def write_tuned(config: PipelineConfig, summary: dict) -> Path:
    """Writes the chosen settings as a nested YAML mapping ``<run_dir>/tuned.yaml``."""
    nested: dict = {}
    for settings in [c["settings"] for c in summary["chosen"].values()] + [
            summary.get("prior", {})]:
        for key, value in settings.items():
            node = nested
            *parents, leaf = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
    lines = [f"# Chosen by gmeta tune on the '{summary['split']}' split by validation "
             f"{summary['metric']}, {summary['trials']} trials per study and "
             f"{summary['rechecks']} re-checks, at world size {summary['world_size']}:"]
    lines += [f"#   {n}: trial {c['trial']}, {summary['metric']} {c['value']:.4f} (best step "
              f"{c['best_step']}; with its re-check {c['mean_with_recheck']:.4f}"
              + ("" if c.get("incumbent_margin") is None else
                 f"; a challenger had to beat trial 0 by {c['incumbent_margin']:.4f}") + ")"
              for n, c in summary["chosen"].items()]
    if summary.get("prior"):
        lines.append("#   the factor prior (model.prior): chosen once before the trials, by "
                     "its fold-in's loss on the validation split and on training tasks held "
                     "out in turn; every trial used it")
    # the pipeline's own value of each chosen key, so a later edit of it can be told apart
    own = config.to_dict()
    keys = [k for c in summary["chosen"].values() for k in c["settings"]] + list(
        summary.get("prior", {}))
    pipeline = {k: v for k in keys
                if (v := dotted_value(own, k)) is not ABSENT and v is not None}
    nested[TUNED_AT_KEY] = {"world_size": summary["world_size"], "pipeline": pipeline}
    text = "\n".join(lines) + "\n" + yaml.safe_dump(nested, sort_keys=True)
    path = Path(config.run_dir) / TUNED_FILE
    write_text_atomically(path, text)
    log.info("wrote %s", path)
    return path
