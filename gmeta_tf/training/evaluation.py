"""Scoring trained models: validation during training (every rank) and the final
comparison of ``gmeta eval`` (one process), through one code path.

Task data (a meta model, or any model evaluated on tasks): every task of a split is
adapted on its support rows and scored on its query rows. The meta model adapts with its
inner loop; the baseline is fine-tuned through the same inner-loop code
(``fine_tuned_adaptation``), on the same fast weights and adapted embedding rows, for
``eval.baseline_steps`` steps (default: the meta model's k) at ``eval.baseline_lr``.

Row data (a plain CTR model, ``meta.enabled: false``): every row of the split is scored.

The validation split (``train.validation_split``, held-out warm tasks) chooses the best
checkpoint and the stopping step; the evaluation split (``eval.split``, cold tasks) is
scored only by ``gmeta eval``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Callable, Collection, Iterable, Mapping

import numpy as np
import tensorflow as tf

from gmeta_tf import data as meta_io
from gmeta_tf import distributed, interrupts
from gmeta_tf.atomic_file import write_atomically
from gmeta_tf.config import PipelineConfig, configured_blend, tower_sparse_features
from gmeta_tf.meta import (EvaluationReport, MetaModel, fine_tuned_adaptation,
                           query_predictions)
from gmeta_tf.meta import metrics
from gmeta_tf.meta.evaluation import (fold_in_predictions, prediction_of, report_from_rows,
                                      traced_once)
from gmeta_tf.meta.paired import LOWER_IS_BETTER, paired_gaps
from gmeta_tf.meta.task_adapter import DIVERGED_LOSS_RATIO
from gmeta_tf.models.tower import Tower
from gmeta_tf.training.model_builder import Models
from gmeta_tf.training.prior_fit import held_out_protocol
from gmeta_tf.training.references import ReferenceData, fit_references

log = logging.getLogger(__name__)

PredictFn = Callable[[Mapping], tf.Tensor]
#: A predict function with several outputs from one pass: name -> ``[T, Q]``.
AdaptationFn = Callable[[Mapping], Mapping[str, tf.Tensor]]
#: Metrics where higher is better (the others: lower is better).
HIGHER_IS_BETTER = ("auc", "ndcg")


# ---- batches -----------------------------------------------------------------------------

def split_dataset(config: PipelineConfig, split: str | None, path: str | None = None, *,
                  features: list[str] | None = None, whole: bool = False
                  ) -> meta_io.TaskDataset:
    """One split of the config's dataset (or of another dataset at ``path``): this rank's
    shard of it, or with ``whole`` all of it on every rank; ``features``: those columns
    only (default: all)."""
    return meta_io.TaskDataset(path or config.data.path, split, reader=config.data.reader,
                               features=features, verify="size",
                               **({"rank": 0, "size": 1} if whole else {}))


#: Rows per batch where a split is read in bulk (the references, the linear start, the
#: dense inputs' scaling): the order of the rows does not depend on it.
ROWS_PER_READ = 4096


def task_batches(config: PipelineConfig, split: str | None, equal_steps: bool,
                 path: str | None = None) -> tf.data.Dataset:
    """Batches of every task of a split, each with its fixed support and query rows.

    With ``equal_steps`` (every rank runs the same number of batches) a split too small
    for one batch of ``eval.tasks_per_batch`` tasks on every rank is read in batches of
    as many tasks as the rank with the fewest has, so a small split is still scored.
    """
    dataset = split_dataset(config, split, path)
    per_batch = config.eval.tasks_per_batch
    if equal_steps:
        per_batch = max(1, min(per_batch, dataset.fewest_tasks_per_rank))
    return dataset.tasks(per_batch, None, None, equal_steps=equal_steps)


def eval_batches(config: PipelineConfig, equal_steps: bool) -> tf.data.Dataset:
    """Task batches of the evaluation split (``eval.split``)."""
    return task_batches(config, config.eval.split, equal_steps)


def row_batches(config: PipelineConfig, split: str | None, path: str | None = None
                ) -> tf.data.Dataset:
    """Every row of a split once, in file order, ``data.batch_size`` rows a batch."""
    return split_dataset(config, split, path).rows(config.data.batch_size)


# ---- predict functions -------------------------------------------------------------------

def meta_predict(model: MetaModel, steps: int | None = None) -> PredictFn:
    """The meta model adapted with its inner loop (``steps`` overrides k; 0: none),
    blended with the label prior's fold-in."""
    return traced_once(lambda batch: model.adapted_predictions(batch, steps))


def meta_adaptation(model: MetaModel, steps: int | None = None) -> AdaptationFn:
    """``meta_predict``'s figures from one pass: predictions blended and not, and which
    tasks' adaptation was kept (``query_predictions``)."""
    return traced_once(lambda batch: query_predictions(model.head,
                                                       model.adapted_query(batch, steps)))


def baseline_steps(config: PipelineConfig) -> int:
    """The baseline's fine-tuning steps: ``eval.baseline_steps``, default the meta model's
    k (``eval.adapt_steps``, else ``meta.inner_steps``), so the two adapt alike unless told."""
    if config.eval.baseline_steps is not None:
        return config.eval.baseline_steps
    return adaptation_steps(config, "model")


def fine_tune_adaptation(model: tf.keras.Model, config: PipelineConfig,
                         steps: int | None = None) -> AdaptationFn:
    """The baseline fine-tuned on each task's support rows exactly as the meta model
    adapts: same code, same fast weights, same adapted embedding rows, blended with the
    label prior's fold-in the same way; ``steps`` SGD steps (default ``baseline_steps``)
    at ``eval.baseline_lr``. Returns ``meta_adaptation``'s figures."""
    steps = baseline_steps(config) if steps is None else steps
    return fine_tuned_adaptation(model, steps, config.eval.baseline_lr,
                                 config.meta.fast_weights, config.meta.adapt_embeddings,
                                 baseline_ridge(config), config.eval.baseline_backtrack)


def fine_tune_predict(model: tf.keras.Model, config: PipelineConfig,
                      steps: int | None = None) -> PredictFn:
    """``fine_tune_adaptation``'s predictions, blended with the fold-in."""
    return prediction_of(fine_tune_adaptation(model, config, steps), blended=True)


def adaptation_steps(config: PipelineConfig, name: str) -> int:
    """How many steps a model of the run adapts a task for: the meta model's k
    (``eval.adapt_steps``, default ``meta.inner_steps``) or the baseline's."""
    if name == "baseline":
        return baseline_steps(config)
    return config.meta.inner_steps if config.eval.adapt_steps is None else config.eval.adapt_steps


def blends(model: tf.keras.Model, config: PipelineConfig, name: str) -> bool:
    """Whether a model of the run (``name``: "model" or "baseline") blends its adapted
    outputs with the label prior's fold-in: its tower has a blend (a prior with factors)
    and it adapts (``adapted_outputs`` blends nothing without steps)."""
    return model.tower.prior_blend is not None and bool(adaptation_steps(config, name))


#: The weight a fitted blend is shrunk toward: the two predictions averaged.
EQUAL_BLEND = 0.5


def chosen_blend(adapted: np.ndarray, fold_in: np.ndarray, labels: np.ndarray,
                 groups: np.ndarray | None = None) -> float:
    """The weight ``b`` in [0, 1] of ``b * adapted + (1 - b) * fold_in``: the weight with
    the least squared error on ``labels`` (closed form), moved toward an equal mix
    (``EQUAL_BLEND``) by at most one standard error of it, then kept in [0, 1].

    The standard error is clustered by ``groups`` (each row's task: a user's rows are
    not independent; default, each row its own). Why shrink: a fitted combination weight
    carries estimation noise that equal weights do not (the forecast-combination puzzle,
    Stock and Watson 2004; Smith and Wallis 2009), and the rows that fit it also chose the
    network's checkpoint and settings, which flatters the network; within one standard
    error the data cannot tell the weights apart, and the simpler mix is kept (the
    one-SE rule, as ``gmeta tune`` keeps its incumbent). Returns 1 when the two
    predictions are the same, and when an adapted prediction is not finite: a diverged
    model is not hidden."""
    adapted = np.asarray(adapted, np.float64)
    fold_in = np.asarray(fold_in, np.float64)
    diff = adapted - fold_in
    denominator = float(np.dot(diff, diff))
    if not np.isfinite(denominator) or denominator <= 0.0:
        return 1.0
    residual = np.asarray(labels, np.float64) - fold_in
    fitted = float(np.dot(residual, diff)) / denominator
    groups = np.arange(len(diff)) if groups is None else np.asarray(groups)
    error = clustered_spread(diff * (residual - fitted * diff), groups) / denominator
    return float(np.clip(np.clip(EQUAL_BLEND, fitted - error, fitted + error), 0.0, 1.0))


def clustered_spread(scores: np.ndarray, groups: np.ndarray) -> float:
    """The cluster-robust (sandwich) spread of a sum of per-row ``scores`` whose rows
    depend on each other within a group (a user's rows): ``sqrt(G / (G - 1) * sum over
    the G groups of (the group's summed scores) ** 2)``; 0 with one group. An estimate's
    standard error is this over the derivative of its estimating equation (a mean's: the
    rows, its scores the rows' deviations from it)."""
    _, group = np.unique(groups, return_inverse=True)
    count = int(group.max()) + 1 if len(group) else 0
    if count < 2:
        return 0.0
    sums = np.bincount(group, weights=scores, minlength=count)
    return float(np.sqrt(count / (count - 1) * np.dot(sums, sums)))


def baseline_ridge(config: PipelineConfig) -> float:
    """The baseline's ridge strength: ``eval.baseline_ridge``, default ``meta.ridge``."""
    if config.eval.baseline_ridge is not None:
        return config.eval.baseline_ridge
    return config.meta.ridge


def row_predict(model: tf.keras.Model) -> PredictFn:
    """A plain CTR model on row batches."""
    names = list(model.tower.sparse_features) + list(model.tower.dense_features)
    return traced_once(lambda rows: model({n: rows[n] for n in names}, training=False))


# ---- scoring -----------------------------------------------------------------------------

@dataclasses.dataclass
class ScoredRows:
    """Scored rows: per row its task, prediction, the head's label, the 0/1 label of AUC,
    the relevance of nDCG and how many support rows its task was adapted on (0 for row
    data)."""

    task_id: np.ndarray
    prediction: np.ndarray
    label: np.ndarray
    binary: np.ndarray
    relevance: np.ndarray
    support: np.ndarray

    @classmethod
    def concat(cls, parts: list["ScoredRows"]) -> "ScoredRows":
        if not parts:
            return cls(*(np.zeros(0) for _ in dataclasses.fields(cls)))
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts])
                     for f in dataclasses.fields(cls)))

    def gathered(self) -> "ScoredRows":
        """The rows of every rank (a collective: call on every rank)."""
        return ScoredRows(*(distributed.allgather(np.asarray(getattr(self, f.name), np.float64))
                            for f in dataclasses.fields(self)))


def _labels(config: PipelineConfig, models: Models) -> tuple[str, str, str]:
    head = models.model.head
    e = config.eval
    return head.label, e.binary_label or head.label, e.relevance_label or head.label


def score_tasks(predict: PredictFn, batches: Iterable[Mapping],
                labels: tuple[str, str, str]) -> ScoredRows:
    """Every real query row of task batches, scored by ``predict`` ([T, Q])."""
    return score_task_outputs(lambda batch: {"": predict(batch)}, batches, labels)[""]


def score_task_outputs(predict: AdaptationFn, batches: Iterable[Mapping],
                       labels: tuple[str, str, str]) -> dict[str, ScoredRows]:
    """Every real query row of task batches, scored by each output of ``predict`` (name
    -> [T, Q]; e.g. ``meta_adaptation``'s, all from one pass)."""
    parts: dict[str, list[ScoredRows]] = {}
    with interrupts.deferred():  # Ctrl-C and SIGTERM stop it between batches
        for batch in interrupts.checked(batches):
            for name, scored in _scored_query_rows(predict(batch), batch, labels).items():
                parts.setdefault(name, []).append(scored)
    return {name: ScoredRows.concat(p) for name, p in parts.items()}


def _scored_query_rows(outputs: Mapping, batch: Mapping,
                       labels: tuple[str, str, str]) -> dict[str, ScoredRows]:
    """One task batch's real query rows, scored by each of ``outputs`` ([T, Q])."""
    label, binary, relevance = labels
    query = batch["query"]
    real = np.asarray(query["mask"]) > 0
    ids = np.broadcast_to(np.asarray(batch["task_id"])[:, None], real.shape)
    support = np.broadcast_to(
        (np.asarray(batch["support"]["mask"]) > 0).sum(axis=1)[:, None], real.shape)
    labelled = (np.asarray(query[label])[real], np.asarray(query[binary])[real],
                np.asarray(query[relevance])[real], support[real])
    return {name: ScoredRows(ids[real], np.asarray(p)[real], *labelled)
            for name, p in outputs.items()}


def score_rows(predict: PredictFn, batches: Iterable[Mapping],
               labels: tuple[str, str, str]) -> ScoredRows:
    """Every row of row batches, scored by ``predict`` ([B])."""
    label, binary, relevance = labels
    with interrupts.deferred():  # Ctrl-C and SIGTERM stop it between batches
        parts = [ScoredRows(np.asarray(b["task_id"]), np.asarray(predict(b)),
                            np.asarray(b[label]), np.asarray(b[binary]),
                            np.asarray(b[relevance]), np.zeros(len(b["task_id"]), np.int64))
                 for b in interrupts.checked(batches)]
    return ScoredRows.concat(parts)


def report(scored: ScoredRows, kind: str, k: int, per_task: bool = True) -> EvaluationReport:
    return report_from_rows(scored.task_id, scored.prediction, scored.label, scored.binary,
                            scored.relevance, kind, k, per_task)


# ---- validation during training (every rank) ---------------------------------------------

def _validated(adaptation: AdaptationFn, blended_here: bool) -> AdaptationFn:
    """What validation scores of an adapting model: ``prediction``. ``blended_here``: the
    predictions unblended, to be blended with the fold-in by the ``Validator`` (which
    chooses the weight), and ``kept`` (1 on the rows of a task whose adaptation was kept:
    only those are blended); otherwise the model's blended predictions (its own weight,
    or none without a prior) alone."""
    if not blended_here:
        return lambda batch: {"prediction": adaptation(batch)["blended"]}

    def predict(batch):
        out = adaptation(batch)
        return {"prediction": out["unblended"], "kept": out["kept"]}

    return predict


def selection_metric(config: PipelineConfig) -> str:
    """The metric that chooses checkpoints: ``train.select_metric`` ("auto": AUC)."""
    metric = config.train.select_metric
    if metric == "auto":
        return "auc"
    if metric == "ndcg":
        return f"ndcg@{config.eval.ndcg_k}"
    return metric


def improves(metric: str, value: float, best: float | None, min_delta: float = 0.0) -> bool:
    """Whether ``value`` beats ``best`` on ``metric`` (NaN never improves)."""
    if value is None or math.isnan(value):
        return False
    if best is None or math.isnan(best):
        return True
    if metric.split("@")[0] in HIGHER_IS_BETTER:
        return value > best + min_delta
    return value < best - min_delta


class Validator:
    """Scores the trained models on the validation split, the same figures on every rank.

    Every rank scores all tasks (or rows) of its share of the split; ranks whose share
    needs fewer batches repeat their last one and drop its scores, so all ranks make the
    same number of calls (the embedding's all-to-alls need it). ``train.eval_batches``
    caps the batches per rank. The scored rows are then gathered over ranks. The predict
    functions are traced once, at the first evaluation.

    Calling it returns ``{"model": metrics, "baseline": metrics}`` (no baseline key
    without one); metrics are ``auc``, ``task_auc``, ``ndcg@k``, ``logloss`` or ``mae``,
    ``tasks`` and ``rows``; empty when the split has no rows.

    Under a label prior with factors, each adapting model's blend with the prior's
    fold-in (``Tower.prior_blend``) is reported as ``blend``, with the selection metric of
    the blended predictions (``blended_auc``). With ``model.prior.blend`` unset it is
    chosen at every validation: the least-squares weight on the validation query rows,
    moved toward an equal mix by up to one standard error (``chosen_blend``, over every
    split of the tasks, clustered by task), set on the tower (so the
    checkpoint saved after it carries it); set, it is the config's. A task whose
    adaptation was undone (``task_adapter.adapted_query``) keeps its unadapted outputs
    unblended, as ``gmeta eval`` scores it and the SavedModel serves it, and its rows do
    not choose the weight. The other metrics,
    those that choose checkpoints and stop training among them, are of the model's own
    predictions either way: the blend is applied to a model, not a way for an untrained
    one to look trained (blended with the fold-in, an early checkpoint's figures are
    largely the factorisation's, and a checkpoint would keep them).
    """

    def __init__(self, models: Models, config: PipelineConfig):
        self.models, self.config = models, config
        self.labels = _labels(config, models)
        self.kind, self.k = models.model.head.kind, config.eval.ndcg_k
        self.tasks = models.is_meta
        self.predictors: dict[str, PredictFn] = {}
        #: Model name -> the tower whose blend is applied (and, unless set, chosen) here.
        self.blended: dict[str, Tower] = {}
        if self.tasks:
            for name, model in (("model", models.model), ("baseline", models.baseline)):
                if model is not None and blends(model, config, name):
                    self.blended[name] = model.tower
            # the blend is applied here, to the predictions unblended of the tasks kept
            self.predictors["model"] = _validated(
                meta_adaptation(models.model, config.eval.adapt_steps), "model" in self.blended)
            if models.baseline is not None:
                self.predictors["baseline"] = _validated(
                    fine_tune_adaptation(models.baseline, config), "baseline" in self.blended)
        else:
            predict = row_predict(models.model)
            self.predictors["model"] = lambda batch: {"prediction": predict(batch)}
        self._batches: list | None = None
        self._fold_in: list[ScoredRows] | None = None
        #: With ``train.linear_margin``: the linear start's validation predictions (step 0).
        self._linear: np.ndarray | None = None
        self._linear_path = (Path(config.checkpoint_dir) / LINEAR_VALIDATION_FILE
                             if guards_linear_start(config) else None)

    def _load(self) -> list[list[tuple[Mapping, bool]]]:
        """The validation batches of every split of the tasks (``train.valid_resplits``):
        per split, ``(batch, real)`` pairs, padded to the same count on every rank."""
        split, limit = self.config.train.validation_split, self.config.train.eval_batches
        dataset = split_dataset(self.config, split)
        splits = []
        for resplit in range(self.config.train.valid_resplits if self.tasks else 1):
            if not self.tasks:
                ds = dataset.rows(self.config.data.batch_size)
            elif resplit == 0:  # the protocol's split, as cold tasks have it
                ds = dataset.tasks(self.config.eval.tasks_per_batch, None, None,
                                   equal_steps=False)
            else:  # the same tasks, their rows split again (the same query count), seeded
                seed = int(np.random.SeedSequence([self.config.data.seed, resplit])
                           .generate_state(1)[0])
                ds = dataset.tasks(self.config.eval.tasks_per_batch, None, None,
                                   equal_steps=False, resplit_seed=seed)
            batches = list(ds.take(limit) if limit else ds)
            count = int(distributed.allgather(np.array([len(batches)], np.int64)).max())
            if count and not batches:
                raise ValueError(f"{dataset.path}: rank {dataset.rank} has no rows of the "
                                 f"{split!r} split while another rank has; the split has too "
                                 f"few blocks for {dataset.size} ranks")
            splits.append([(b, True) for b in batches]
                          + [(batches[-1], False)] * (count - len(batches)))
        return splits

    def __call__(self, skip: Collection[str] = (), step: int | None = None
                 ) -> dict[str, dict[str, float]]:
        """Every model's metrics but those of the models in ``skip``; ``step`` 0 is the
        linear start's validation (``train.linear_margin``: its predictions are kept)."""
        if self._batches is None:  # read once: the split does not change during training
            self._batches = self._load()
        out = {}
        for name, predict in self.predictors.items():
            if name in skip:
                continue
            scored = [self._scored(predict, batches) for batches in self._batches]
            splits = [s["prediction"] for s in scored]
            reports = self._reports(splits)
            if not reports:
                continue
            out[name] = mean_over_splits(reports)
            if self._linear_path is not None and name == "model":
                margin = self._linear_margin(splits[0], step)
                if margin is not None:
                    out[name]["linear_margin"] = margin
            if name in self.blended:
                blended, out[name]["blend"] = self._blend(self.blended[name], splits,
                                                          [s["kept"] for s in scored])
                metric = selection_metric(self.config)
                out[name][f"blended_{metric}"] = mean_over_splits(
                    self._reports(blended))[metric]
        return out

    def _linear_margin(self, scored: ScoredRows, step: int | None) -> float | None:
        """How far this validation's selection metric must beat the linear start's for the
        model to replace it as the best checkpoint: ``train.linear_margin`` standard errors
        of their paired difference on these rows. At step 0 (the linear start itself) its
        predictions are kept, in memory and beside the checkpoints for a resumed run."""
        if step == 0:
            self._linear = np.asarray(scored.prediction, np.float64)
            if distributed.rank() == 0:
                self._linear_path.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(self._linear_path, self._save_linear)
            return None
        if self._linear is None and self._linear_path.is_file():
            with open(self._linear_path, "rb") as f:
                self._linear = np.load(f)
        margin = math.nan  # no linear start validated on these rows: no guard
        if self._linear is not None and len(self._linear) == len(scored.prediction):
            se = paired_difference_se(selection_metric(self.config), self.kind, scored.binary,
                                      scored.label, scored.prediction, self._linear)
            margin = self.config.train.linear_margin * se
        # rank 0's, so every rank chooses alike (a resumed rank reads the file rank 0 wrote)
        margin = float(distributed.allgather(np.array([margin], np.float64))[0])
        return margin if math.isfinite(margin) else None

    def _save_linear(self, path: Path) -> None:
        with open(path, "wb") as f:
            np.save(f, self._linear)

    def _reports(self, splits: list[ScoredRows]) -> list[dict[str, float]]:
        return [report(s, self.kind, self.k, self.tasks).overall
                for s in splits if len(s.prediction)]

    def _scored(self, predict: AdaptationFn, batches: list[tuple[Mapping, bool]]
                ) -> dict[str, ScoredRows]:
        """One split's rows of every rank scored by each output of ``predict`` (a
        collective)."""
        if self.tasks:
            parts = [score_task_outputs(predict, [batch], self.labels) for batch, _ in batches]
        else:
            parts = [{"prediction": score_rows(lambda b: predict(b)["prediction"], [batch],
                                               self.labels)} for batch, _ in batches]
        real = [p for p, (_, is_real) in zip(parts, batches) if is_real]
        names = real[0].keys() if real else ("prediction",)
        return {n: ScoredRows.concat([p[n] for p in real]).gathered() for n in names}

    def _blend(self, tower: Tower, splits: list[ScoredRows], kept: list[ScoredRows]
               ) -> tuple[list[ScoredRows], float]:
        """The splits' rows blended with the prior's fold-in at the config's weight or,
        unset, the weight chosen on them, which is set on ``tower``; and that weight.

        Only the rows of tasks whose adaptation was kept (``kept``'s predictions: 1 or 0
        per row) are blended or choose the weight: an undone task's rows are its unadapted
        outputs, unblended, as ``gmeta eval`` scores them and the SavedModel serves them
        (``task_adapter.adapted_query``)."""
        if self._fold_in is None:  # the prior is fixed during training: scored once
            predict = fold_in_predictions(tower, self.models.model.head)
            self._fold_in = [self._scored(lambda b: {"prediction": predict(b)}, batches)
                             ["prediction"] for batches in self._batches]
        fold_in = [f.prediction for f in self._fold_in]
        for s, f, k in zip(splits, self._fold_in, kept):  # the same batches: the same rows
            assert np.array_equal(s.task_id, f.task_id) and np.array_equal(s.label, f.label)
            assert np.array_equal(s.task_id, k.task_id)
        blended_rows = [k.prediction > 0.5 for k in kept]
        blend = configured_blend(self.config.model)
        if blend is None:
            chosen_on = np.concatenate(blended_rows)
            blend = chosen_blend(np.concatenate([s.prediction for s in splits])[chosen_on],
                                 np.concatenate(fold_in)[chosen_on],
                                 np.concatenate([s.label for s in splits])[chosen_on],
                                 np.concatenate([s.task_id for s in splits])[chosen_on])
        tower.prior_blend.assign(blend)
        return [dataclasses.replace(s, prediction=np.where(
                    rows, blend * s.prediction + (1.0 - blend) * f, s.prediction))
                for s, f, rows in zip(splits, fold_in, blended_rows)], blend


#: The linear start's validation predictions, beside the checkpoints (``Validator``).
LINEAR_VALIDATION_FILE = "LINEAR_VALIDATION.npy"


def guards_linear_start(config: PipelineConfig) -> bool:
    """Whether a checkpoint must beat the linear start by ``train.linear_margin``."""
    return (config.model.start_from_linear and config.train.linear_margin > 0
            and not config.meta.enabled)


def paired_difference_se(metric: str, kind: str, binary: np.ndarray, label: np.ndarray,
                         a: np.ndarray, b: np.ndarray) -> float:
    """Standard error of ``metric`` of predictions ``a`` minus that of ``b`` on the same
    rows: DeLong's for AUC, of the mean paired row difference for log loss and MAE."""
    if metric == "auc":
        return metrics.auc_difference_se(binary, a, b)
    if metric in ("logloss", "mae"):
        rows = metrics.row_log_losses if kind == "binary" else metrics.row_absolute_errors
        difference = rows(label, a) - rows(label, b)
        if len(difference) < 2:
            return math.nan
        return float(np.std(difference, ddof=1) / math.sqrt(len(difference)))
    return math.nan


def mean_over_splits(reports: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the reports of several splits of the same tasks; ``tasks``
    as one split has them, ``rows`` the rows scored in all of them."""
    merged = {k: float(np.mean([r[k] for r in reports])) for k in reports[0]
              if k not in ("tasks", "rows")}
    if "tasks" in reports[0]:
        merged["tasks"] = reports[0]["tasks"]
    if "rows" in reports[0]:
        merged["rows"] = sum(r["rows"] for r in reports)
    return merged


# ---- final evaluation (gmeta eval) -------------------------------------------------------

@dataclasses.dataclass
class ComparedRow:
    """One line of the comparison: its metrics and the rows they were computed from;
    ``blend``, for a model's predictions blended with the prior's fold-in, the weight of
    its own (the rest the fold-in's; 0: the fold-in alone)."""

    name: str
    report: EvaluationReport
    scored: ScoredRows
    blend: float | None = None
    #: Tasks whose adaptation diverged and was undone (scored unadapted; ``adapted_query``).
    undone: tuple[int, ...] = ()


def paired_against_first(rows: list[ComparedRow], kind: str, k: int, per_task: bool,
                         seed: int = 0) -> list[dict]:
    """The first row's gap over every other row, each metric with its paired bootstrap
    interval over the tasks (or rows) scored (``gmeta_tf.meta.paired``).

    Raises:
        ValueError: The rows were not scored on the same rows in the same order.
    """
    if len(rows) < 2:
        return []
    first = rows[0].scored
    for other in rows[1:]:
        if not np.array_equal(first.task_id, other.scored.task_id) or not np.array_equal(
                first.label, other.scored.label):
            raise ValueError(f"{rows[0].name!r} and {other.name!r} were not scored on the same "
                             f"rows in the same order: no paired comparison")
    gaps = paired_gaps(first.task_id, first.binary, first.relevance, first.label,
                       first.prediction, [r.scored.prediction for r in rows[1:]], kind, k,
                       per_task, seed=seed)
    out = [{"name": r.name, **g} for r, g in zip(rows[1:], gaps)]
    return _finite_or_none(out)


def support_size_bands(sizes: np.ndarray, bands: int = 3) -> list[tuple[int, int]]:
    """Up to ``bands`` ranges ``(low, high)`` of support sizes, inclusive, that split the
    tasks (``sizes``: one per task) into groups as equal as ties allow, fewest rows first;
    fewer when the tasks have fewer distinct sizes."""
    sizes = np.sort(np.asarray(sizes, np.int64))
    if not len(sizes):
        return []
    edges = sorted({int(sizes[min(len(sizes) - 1, math.ceil(len(sizes) * b / bands) - 1)])
                    for b in range(1, bands + 1)})
    lows = [int(sizes[0])] + [e + 1 for e in edges[:-1]]
    return [(lo, hi) for lo, hi in zip(lows, edges) if ((sizes >= lo) & (sizes <= hi)).any()]


def by_support_size(rows: list[ComparedRow], kind: str, k: int, bands: int = 3) -> list[dict]:
    """Each row's metrics on the tasks of each band of support sizes (``support_size_bands``
    of the scored tasks): which new users each model serves well, the fewest-rated apart.
    A band holds a third of the tasks, so its figures are noisier than the whole split's.

    Returns:
        Per band ``{"support": "low-high", "tasks": n, "rows": [{"name", metrics...}]}``;
        empty for row data (no support rows) or no rows.
    """
    if not rows or not len(rows[0].scored.task_id) or not rows[0].scored.support.any():
        return []
    first = rows[0].scored
    _, at = np.unique(first.task_id, return_index=True)
    out = []
    for low, high in support_size_bands(first.support[at], bands):
        keep = (first.support >= low) & (first.support <= high)
        band_rows = []
        for r in rows:
            s = r.scored
            overall = report_from_rows(s.task_id[keep], s.prediction[keep], s.label[keep],
                                       s.binary[keep], s.relevance[keep], kind, k).overall
            band_rows.append({"name": r.name, **{m: _json_number(v) for m, v in overall.items()}})
        out.append({"support": f"{low}-{high}", "tasks": band_rows[0]["tasks"],
                    "rows": band_rows})
    return out


def format_by_support_size(bands: list[dict], metrics: list[str]) -> str:
    """``by_support_size`` as one table: a line per band and row, the given metrics."""
    if not bands:
        return ""
    head = ("by the number of support rows a task was adapted on (each band about a third "
            "of the tasks, so noisier than the table above)")
    lines = [{"support": b["support"], **r} for b in bands for r in b["rows"]]
    columns = ["support", "name", *[m for m in metrics if m != "name"]]
    return head + "\n" + format_table(lines, columns)


def _finite_or_none(value):
    """NaN (an AUC on one class) as None, for JSON."""
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def reference_data(config: PipelineConfig, models: Models) -> ReferenceData:
    """What the reference predictors read: the candidate features of the mean-label
    references (``eval.reference_feature``, or every sparse feature of the tower that is
    not adapted per task: the one with the best validation loss is kept) and every
    feature of the tower for the linear model."""
    model = config.model
    if config.eval.reference_feature is not None:
        candidates = (config.eval.reference_feature,)
    else:
        candidates = tuple(f for f in tower_sparse_features(model)
                           if f not in config.meta.adapt_embeddings)
    tower = models.model.tower
    shift, scale, logged = ((), (), ()) if tower.dense_shift is None else (
        tuple(float(x) for x in variable.numpy())
        for variable in (tower.dense_shift, tower.dense_scale, tower.dense_log))
    return ReferenceData(models.model.head.kind, models.model.head.label, candidates,
                         tuple(tower_sparse_features(model)), tuple(model.dense_features),
                         dense_shift=shift, dense_scale=scale, dense_log=logged)


def comparison(models: Models, config: PipelineConfig, split: str | None = None,
               path: str | None = None, references=None) -> list[ComparedRow]:
    """Every task (or row) of a split scored by the models, their baselines and the
    reference predictors, on the same rows.

    Args:
        models: The restored models.
        config: The pipeline config.
        split: The split to score (default ``eval.split``); None with ``path``: every file.
        path: Another dataset (same schema) to score instead of the config's.
        references: Fitted reference predictors to score too (``fit_reference_predictors``),
            or None.
    """
    split = config.eval.split if split is None and path is None else split
    labels = _labels(config, models)
    kind, k, e = models.model.head.kind, config.eval.ndcg_k, config.eval
    tasks = models.is_meta

    def batches():
        if tasks:
            return task_batches(config, split, equal_steps=False, path=path)
        return row_batches(config, split, path)

    def scored(predict) -> tuple[EvaluationReport, ScoredRows]:
        rows = (score_tasks if tasks else score_rows)(predict, batches(), labels)
        return report(rows, kind, k, tasks), rows

    rows = []

    def adapted(title: str, short: str, model, name: str, adaptation: AdaptationFn) -> None:
        """The row of a model adapted per task (``title`` names its blend, when blended
        with the prior's fold-in) and then, unless the blend is 1, the row of its
        predictions unblended, both from one pass of its adaptation; both carry the tasks
        whose adaptation diverged and was undone."""
        blend = (float(model.tower.prior_blend.numpy()) if tasks and blends(model, config, name)
                 else None)
        scored_rows = score_task_outputs(adaptation, batches(), labels)
        kept = scored_rows["kept"]
        undone = tuple(int(t) for t in np.unique(kept.task_id[kept.prediction < 0.5]))
        if undone:
            log.warning("%s: %s", short, undone_text(undone, len(np.unique(kept.task_id))))
        rows.append(ComparedRow(title + ("" if blend is None else f", blend {blend:.2f}") + ")",
                                report(scored_rows["blended"], kind, k, tasks),
                                scored_rows["blended"], blend=blend, undone=undone))
        if blend is not None and blend != 1.0:
            rows.append(ComparedRow(f"{short}, not blended with the fold-in",
                                    report(scored_rows["unblended"], kind, k, tasks),
                                    scored_rows["unblended"], undone=undone))

    if models.is_meta:
        ridge = " + ridge" if config.meta.ridge else ""
        adapted(f"meta ({config.meta.algorithm}, adapted k={adaptation_steps(config, 'model')}"
                f"{ridge}", "meta", models.model, "model",
                meta_adaptation(models.model, e.adapt_steps))
        rows.append(ComparedRow("meta, no adaptation", *scored(meta_predict(models.model, 0))))
    else:
        rows.append(ComparedRow("ctr model", *scored(row_predict(models.model))))
    if models.baseline is not None:
        strength = baseline_ridge(config)
        ridge = f", ridge {strength:g}" if strength else ""
        adapted(f"baseline fine-tuned (k={baseline_steps(config)}{ridge}", "baseline",
                models.baseline, "baseline", fine_tune_adaptation(models.baseline, config))
        rows.append(ComparedRow("baseline, no fine-tuning",
                                *scored(fine_tune_predict(models.baseline, config, 0))))
    if references is not None:
        for name, predict in references.predictors.items():
            rows.append(ComparedRow(f"reference: {name}", *scored(predict)))
    return rows


def fit_reference_predictors(models: Models, config: PipelineConfig):
    """The reference predictors fitted on the training split, tuned on validation."""
    tasks = models.is_meta
    data = reference_data(config, models)
    train = split_dataset(config, "warm").rows(ROWS_PER_READ)
    split = config.train.validation_split
    if tasks:
        valid = list(task_batches(config, split, equal_steps=False))
    else:
        valid = list(row_batches(config, split))
    return fit_references(data, train, valid, tasks, seed=config.model.seed,
                          members=config.model.members,
                          held_out=held_out_protocol(config) if tasks else None)


def comparison_dict(rows: list[ComparedRow]) -> list[dict]:
    """The comparison as JSON-ready dicts (``eval-<split>.json``); a blended row also
    carries its ``blend``."""
    return [{"name": r.name, **{k: _json_number(v) for k, v in r.report.overall.items()},
             **({} if r.blend is None else {"blend": r.blend}),
             **({"undone_tasks": list(r.undone)} if r.undone else {})} for r in rows]


def undone_text(undone: Collection[int], tasks: int) -> str:
    """What a row's undone tasks mean, naming them (the first 20)."""
    names = ", ".join(str(t) for t in list(undone)[:20]) + (", ..." if len(undone) > 20 else "")
    return (f"the adaptation diverged (the support loss rose over {DIVERGED_LOSS_RATIO:g}-fold, "
            f"or it or a score was not finite) and was undone on {len(undone)} of {tasks} "
            f"tasks, scored unadapted as served: tasks {names}")


def format_undone(rows: list[dict]) -> str:
    """A line per row with undone tasks (``comparison_dict``'s ``undone_tasks``)."""
    return "\n".join(f"{r['name']}: {undone_text(r['undone_tasks'], r.get('tasks') or 0)}"
                     for r in rows if r.get("undone_tasks"))


def _json_number(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain-text table: one line per dict, the given columns (missing -> '-')."""
    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4f}"
        return str(value)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def format_gaps(first: str, paired: list[dict], metrics: list[str]) -> str:
    """``paired_against_first`` as text: per row the first row's gap on each of ``metrics``
    that the gaps hold (other columns are skipped), its interval, and how often the first
    was better over the resamples."""
    if not paired:
        return ""
    p0 = paired[0]
    metrics = [m for m in metrics if m in p0["metrics"]]
    signs = ", ".join(f"{m} {'< 0' if m in LOWER_IS_BETTER else '> 0'}" for m in metrics)
    head = (f"{first} minus each row: the gap, its {p0['level']:.0%} interval over "
            f"{p0['resamples']} resamples of the {p0['units']} {p0['unit']}s scored, and the "
            f"share of resamples where {first.split(' (')[0]} is better ({signs}: better; a tie "
            f"counts half)")

    def cell(g: dict) -> str:
        if any(g[k] is None for k in ("gap", "low", "high", "first_better")):
            return "-"
        return f"{g['gap']:+.4f} [{g['low']:+.4f}, {g['high']:+.4f}] {g['first_better']:.0%}"

    rows = [{"name": p["name"], **{m: cell(p["metrics"][m]) for m in metrics}} for p in paired]
    return head + "\n" + format_table(rows, ["name", *metrics])
