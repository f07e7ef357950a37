"""Choosing checkpoints on the validation split: each model's best step, early stopping.

``Selection`` keeps, per trained model ("model", and "baseline" when one is trained beside
it), the step with the best validation metric so far, the evaluations since that model
last improved, the step its patience ran out (it trains no more from there) and every
evaluation's metrics. Each model stops on its own count: one model still improving does
not keep the other training, and one model stopping does not cut the other's run short,
so a model's run, best step and value do not depend on the other's settings. Rank 0
writes it after each evaluation to ``<checkpoint_dir>/BEST.json`` (atomically), so
``gmeta eval`` / ``gmeta export`` restore each model's best checkpoint, pruning keeps
those checkpoints, and ``--resume`` goes on with the same patience counts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from pathlib import Path

from gmeta_tf.atomic_file import write_text_atomically
from gmeta_tf.training.evaluation import improves

log = logging.getLogger(__name__)
BEST_FILE = "BEST.json"
#: The model whose pre-training steps (``patience_from``) do not count toward patience.
PRETRAINED = "model"


@dataclasses.dataclass
class Best:
    """A model's best validation result so far."""

    step: int
    value: float
    metrics: dict[str, float]


@dataclasses.dataclass
class Selection:
    """Best steps per model and the early-stopping count.

    Args:
        metric: The metric that chooses (``gmeta_tf.training.evaluation.selection_metric``).
        patience: Evaluations without a model improving before that model stops training
            (0: never).
        patience_from: The meta model's (``"model"``) evaluations at steps up to this one
            do not count toward its patience (its pre-training steps); the baseline's
            patience counts from its first evaluation, so its stopping point does not
            depend on the meta model's settings.
        protocol: How validation scores (``validation_protocol``): values measured under
            another protocol are not compared with these.
    """

    metric: str
    patience: int = 0
    patience_from: int = 0
    protocol: dict = dataclasses.field(default_factory=dict)
    best: dict[str, Best] = dataclasses.field(default_factory=dict)
    #: Model -> evaluations since it last improved (those after ``patience_from``).
    stale: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Model -> the evaluation step its patience ran out at: it trains no more.
    finished: dict[str, int] = dataclasses.field(default_factory=dict)
    history: list[dict] = dataclasses.field(default_factory=list)
    #: Model -> the step its training loss was found not finite: it trains no more (a
    #: resumed run past that step keeps it stopped at its best checkpoint).
    halted: dict[str, int] = dataclasses.field(default_factory=dict)

    def update(self, step: int, results: dict[str, dict[str, float]]) -> list[str]:
        """Records one evaluation; returns the models that improved at this step."""
        improved = []
        results = {n: {k: (None if isinstance(v, float) and math.isnan(v) else v)
                       for k, v in m.items()} for n, m in results.items()}  # JSON has no NaN
        for name, metrics in results.items():
            value = metrics.get(self.metric)
            value = math.nan if value is None else value
            previous = self.best.get(name)
            # the linear start (step 0) is kept unless beaten by a margin (linear_margin)
            margin = metrics.get("linear_margin") if previous and previous.step == 0 else None
            if improves(self.metric, value, previous.value if previous else None,
                        min_delta=margin or 0.0):
                self.best[name] = Best(step, float(value), dict(metrics))
                improved.append(name)
        for name in results:
            fresh = name in improved or (name == PRETRAINED and step <= self.patience_from)
            self.stale[name] = 0 if fresh else self.stale.get(name, 0) + 1
            if self.patience and self.stale[name] >= self.patience:
                self.finished.setdefault(name, step)
        self.history.append({"step": step, **{n: m for n, m in results.items()}})
        return improved

    def should_stop(self, names) -> bool:
        """Whether every one of ``names`` (the run's models) has run out of patience."""
        return bool(self.patience) and all(n in self.finished for n in names)

    @property
    def protected_steps(self) -> set[int]:
        return {b.step for b in self.best.values()}

    def to_dict(self) -> dict:
        return {"metric": self.metric, "protocol": self.protocol,
                "patience": self.patience, "stale": self.stale,
                "finished": self.finished,
                "best": {n: dataclasses.asdict(b) for n, b in self.best.items()},
                "history": self.history, "halted": self.halted}

    def save(self, checkpoint_dir: str | Path) -> None:
        """Writes ``BEST.json`` atomically (call on one rank)."""
        path = Path(checkpoint_dir) / BEST_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), indent=1, default=float)
        write_text_atomically(path, text)

    @classmethod
    def load(cls, checkpoint_dir: str | Path, metric: str, patience: int,
             up_to_step: int | None = None, patience_from: int = 0,
             protocol: dict | None = None) -> "Selection":
        """The selection saved in ``checkpoint_dir`` (a fresh one if none, or if it chose
        on another metric or validation protocol), replayed up to ``up_to_step`` (a
        resumed run forgets the evaluations after the checkpoint it restarts from)."""
        protocol = dict(protocol or {})
        selection = cls(metric, patience, patience_from, protocol)
        path = Path(checkpoint_dir) / BEST_FILE
        if not path.is_file():
            return selection
        try:
            saved = json.loads(path.read_text())
            history = list(saved["history"])
            saved_metric = saved["metric"]
            saved_protocol = dict(saved.get("protocol", {}))
            halted = {str(n): int(step) for n, step in saved.get("halted", {}).items()}
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("%s is unreadable (%s): choosing best checkpoints anew", path, err)
            return selection
        now = {"metric": metric, **protocol}
        saved_by = {**LEGACY_PROTOCOL, **saved_protocol, "metric": saved_metric}
        was = {k: saved_by.get(k, v) for k, v in now.items()}  # keys it lacks: as now
        if was != now:
            log.warning("%s chose on validation by %s, this run validates by %s: its values "
                        "do not compare; choosing best checkpoints anew", path, _shown(was),
                        _shown(now))
            return selection
        for entry in history:
            if up_to_step is not None and entry.get("step", 0) > up_to_step:
                break
            selection.update(entry["step"], {k: v for k, v in entry.items() if k != "step"})
        selection.halted = {n: step for n, step in halted.items()
                            if up_to_step is None or step <= up_to_step}
        return selection


def validation_protocol(split: str, resplits: int, rows: str | None = None) -> dict:
    """What a validation value depends on besides the model: the split scored, how many
    splits of each task's rows it averages (``train.valid_resplits``) and, when given, which
    rows the split holds (``split_rows``: a dataset made again from a log that grew holds
    others)."""
    return {"split": split, "resplits": resplits, **({} if rows is None else {"rows": rows})}


def split_rows(manifest, split: str) -> str:
    """A digest of the files of a dataset's split (their SHA-256s): which rows it holds."""
    sums = sorted(f.sha256 for f in manifest.files_of(split))
    return hashlib.sha256(" ".join(sums).encode()).hexdigest()[:16]


#: What a ``BEST.json`` written before it recorded its protocol validated under: one split
#: of each task's rows (the split scored was not recorded; it is taken to be this run's).
LEGACY_PROTOCOL = {"resplits": 1}


def _shown(protocol: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(protocol.items()))


def best_checkpoints(checkpoint_dir: str | Path) -> dict[str, dict]:
    """``{model name: {"step", "value", "metrics"}}`` from ``BEST.json`` ({} without one),
    plus ``"metric"`` naming what chose them."""
    path = Path(checkpoint_dir) / BEST_FILE
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text())
        return {"metric": saved["metric"], **saved["best"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("%s is unreadable (%s): using the latest checkpoint", path, err)
        return {}
