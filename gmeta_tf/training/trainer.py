"""The training loop of ``gmeta train``: one code path for one rank and many.

Every rank reads its share of the warm tasks (Meta-IO shards whole tasks over ranks), runs
the meta step and, with ``train.baseline``, the baseline's step on the same rows; a plain
CTR model (``meta.enabled: false``) reads row batches of every warm row instead. Training
tasks' support and query rows are drawn anew each epoch (``train.resplit``). Every
``train.eval_every`` steps each model is scored on the validation split; its best step is
checkpointed and kept (``gmeta_tf.training.selection``), and with ``train.patience`` a
model that has not improved for that many evaluations (counted from the end of
``train.pretrain_steps``) stops training while the other trains on; the run ends when no
model is left training. A model whose loss is not finite stops training at the next
log or validation step, put back to its best checkpoint (before its first validation: to
its weights before training, which a run of two validated models keeps beside its
checkpoints until it ends), while the other trains on (a diverging meta model does not cut
the baseline's run short, nor the reverse: in ``gmeta tune`` each trial's two models get
their full run); when no model is left, training stops. Rank 0 draws the progress bar and writes
TensorBoard scalars; figures that differ per rank (loss, samples, table sizes, all-to-all
bytes) are summed or averaged over ranks first. Checkpoints (``gmeta_tf.checkpoint``:
every rank writes its table shards) are written every ``train.checkpoint_every`` steps and
at the end; ``resume=True`` restores the latest one. The batches of step n on rank r are a
function of the shuffle seed, n, r and the world size, so on the world size that saved the
checkpoint a resumed run takes the very batches of an uninterrupted run and ends with its
weights; on another world size it takes, from the checkpoint's step on, the batches an
uninterrupted run at the new size takes at those steps.

With ``train.hybrid`` (the plain CTR model only) the steps run through
``gmeta_tf.training.hybrid.HybridTrainer``: embedding pulls run up to ``staleness`` batches ahead
of their updates in a background thread while the dense step stays synchronous. The run is
cut into segments at every log, evaluation and checkpoint step; each segment ends with
every pending update applied, so reports, evaluations and checkpoints see consistent
tables (and a resumed run takes the same schedule as an uninterrupted one). Tables with a
``cache`` report their hit rate with each log line; the staleness seen and the caches'
counters go into the run's summary.

Example::

    config = load_config("default", ["train.steps=200"])
    result = Trainer(config, fresh=True).run()
    result.final_loss, result.checkpoint
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator, NoReturn

import numpy as np
import tensorflow as tf

from gmeta_tf import checkpoint, distributed, interrupts
from gmeta_tf import data as meta_io
from gmeta_tf.atomic_file import write_text_atomically
from gmeta_tf.config import ConfigError, PipelineConfig, dump_config, tuned_world_size
from gmeta_tf.data.schema import TASK_COLUMN
from gmeta_tf.graph_function import graph_function
from gmeta_tf.machine import machine
from gmeta_tf.training.hybrid import HybridTrainer
from gmeta_tf.meta import task_rows
from gmeta_tf.meta.task_adapter import initial_ridge
from gmeta_tf.models.embedding_inputs import embedding_inputs
from gmeta_tf.training.config_check import check_against_dataset, check_data_files
from gmeta_tf.training.devices import configure_devices
from gmeta_tf.training.evaluation import Validator, guards_linear_start, selection_metric
from gmeta_tf.training.model_builder import (Models, build_models, dense_slow_variables,
                                             set_configured_blend)
from gmeta_tf.training.dense_scaling import fit_dense_scaling
from gmeta_tf.training.linear_start import start_from_linear
from gmeta_tf.training.prior_fit import fit_prior
from gmeta_tf.training.progress import ProgressBar
from gmeta_tf.training.selection import Selection, split_rows, validation_protocol
from gmeta_tf.training.stop_vote import StopVote
from gmeta_tf.training.rank_agreement import on_all_ranks

log = logging.getLogger(__name__)
SUMMARY_FILE = "train_summary.json"


@dataclasses.dataclass
class TrainResult:
    """What a run did (rank 0 also writes it to ``<run_dir>/train_summary.json``)."""

    start_step: int
    steps: int
    seconds: float
    samples: int
    final_loss: float
    baseline_loss: float | None
    checkpoint: str
    world_size: int
    table_rows: dict[str, int]
    alltoall_bytes_per_step: float
    eval: dict[str, float]
    #: With ``train.hybrid``: the staleness seen by this run's batches (all ranks):
    #: staleness_bound, staleness_max, staleness_mean, staleness_hist (batches pulled with
    #: k updates missing, k = 0..bound), and per-rank mean seconds waiting for rows, in
    #: dense steps and re-filling caches. None for the plain synchronous step.
    hybrid: dict | None = None
    #: Per cached table, the MixCache counters summed over ranks since the tables were
    #: made (hits, lookups, size, capacity, admitted, evicted) and hit_rate.
    cache: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    #: Per model ("model", "baseline"): its best validation step, value and metrics.
    best: dict[str, dict] = dataclasses.field(default_factory=dict)
    #: The step early stopping ended the run at (None: it ran to ``train.steps``).
    stopped_early_at: int | None = None
    #: Per model whose loss was found not finite: the step it stopped training at.
    diverged_at: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Per model whose patience ran out: the step it stopped training at (the run goes on
    #: while another model trains; it ends at ``stopped_early_at`` when none is left).
    finished_at: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def samples_per_sec(self) -> float:
        return self.samples / max(self.seconds, 1e-9)


def require_resume_or_fresh(config: PipelineConfig, resume: bool, fresh: bool) -> None:
    """Refuses to train over a run directory's checkpoints without ``--resume`` or
    ``--fresh`` (``gmeta train --np N`` checks it before any rank starts)."""
    latest = checkpoint.latest(config.checkpoint_dir)
    if latest is not None and not resume and not fresh:
        raise ConfigError(f"run_dir {config.run_dir} already has checkpoints (latest "
                          f"{latest.name}): pass --resume to continue from it or --fresh to "
                          f"start over")


class Trainer:
    """Trains a pipeline's models.

    Args:
        config: The pipeline config.
        resume: Continue from the latest complete checkpoint of ``run_dir`` (starts from
            scratch when there is none).
        fresh: Start from scratch; earlier checkpoints of ``run_dir`` are set aside (after
            the config and data are checked) and deleted once this run has written its
            first checkpoint.

    Raises:
        ConfigError: Checkpoints exist but neither ``resume`` nor ``fresh`` was given, or
            the data is too small for one batch per rank.
    """

    def __init__(self, config: PipelineConfig, resume: bool = False, fresh: bool = False):
        if resume and fresh:
            raise ConfigError("--resume and --fresh exclude each other")
        self.config, self.resume, self.fresh = config, resume, fresh
        distributed.init()
        self.rank, self.size = distributed.rank(), distributed.size()
        self.placement = configure_devices()
        self.ckpt_dir = Path(config.checkpoint_dir)
        self._cache_base: dict[str, dict[str, float]] = {}  # cache counters at the last report
        self._validator: Validator | None = None
        self._selection: Selection | None = None  # the run's, from _run on
        self._aside: Path | None = None  # --fresh: the earlier checkpoints, until replaced
        # Every rank: this --fresh run set earlier checkpoints aside and has not replaced
        # them yet (a stop then writes none: they come back instead, ``_stop_here``).
        self._replacing = False
        # A run from step 0: the files an earlier run left in eval/ and tensorboard/, set
        # aside at its first checkpoint (``_set_earlier_results_aside``)
        self._earlier: list[Path] = []
        # Every model's weights before training (two models validated): what one that
        # diverges before its first validation is put back to, so the other trains on.
        self._initial_root = self.ckpt_dir.with_name(f"{self.ckpt_dir.name}.initial")
        self._initial: Path | None = None

    # -- set-up --------------------------------------------------------------------------

    def _check_inputs(self) -> None:
        """Every rank checks the config against the dataset and its share of the data
        files (sizes, schemas and, under ``data.verify: checksum``, SHA-256) before
        anything is changed; a failure anywhere stops every rank, with the run directory
        untouched."""
        d = self.config.data

        def check() -> None:
            t = self.config.train
            check_against_dataset(self.config, meta_io.Manifest.load(d.path), training=True,
                                  eval_split=False)
            dataset = check_data_files(
                self.config, d.path,
                ["warm", *([t.validation_split] if t.eval_every else [])])["warm"]
            if not self.config.meta.enabled and dataset.num_rows < 1:
                raise ConfigError(f"config key 'data.path' = {d.path!r}: rank {self.rank} of "
                                  f"{self.size} has no warm rows")
            if self.config.meta.enabled and dataset.steps_per_epoch(d.tasks_per_batch) < 1:
                raise ConfigError(f"config key 'data.tasks_per_batch' = {d.tasks_per_batch} "
                                  f"is not allowed: expected at most the warm tasks of each "
                                  f"rank's share (the smallest share, of {self.size} ranks, has "
                                  f"{dataset.fewest_tasks_per_rank})")

        on_all_ranks(check, "checking the config and the dataset")

    def _start_step(self, models: Models) -> int:
        self._recover_aside()
        if self.fresh or checkpoint.latest(self.ckpt_dir) is None:
            if self.fresh:
                self._set_aside()
            self._earlier = self._earlier_results() if self.rank == 0 else []
            return 0
        require_resume_or_fresh(self.config, self.resume, self.fresh)
        # The newest checkpoint may be damaged (a crash, a bad disk): walk back to the
        # newest one whose checksums and arrays pass, logging why the others were skipped.
        restored = checkpoint.restore_latest_good(self.ckpt_dir, models.state, models.optimizers)
        log.info("resumed from %s (step %d, saved by %d ranks)", restored.directory,
                 restored.step, restored.world_size)
        self._set_damaged_aside(restored)
        return restored.step

    def _set_damaged_aside(self, restored: checkpoint.Restored) -> None:
        """A newer checkpoint passed over as damaged (complete by its manifest, failing its
        checks) is renamed ``damaged-ckpt-<step>``, kept for a look but no longer a
        checkpoint: pruning would otherwise count it as the newest and delete the good
        ones this run writes before its step."""
        if self.rank == 0:
            for directory, why in restored.skipped:
                if (directory / checkpoint.MANIFEST).is_file():
                    aside = directory.with_name(f"damaged-{directory.name}")
                    os.replace(directory, aside)
                    log.warning("the damaged checkpoint %s is set aside as %s (%s)",
                                directory, aside, why)
        distributed.barrier()

    def _set_aside(self) -> None:
        """``--fresh``: the old checkpoints move to ``checkpoints.replaced-<time>`` beside
        them; they are deleted once this run has written its first checkpoint, and moved
        back if it fails before."""
        if self.rank == 0 and self.ckpt_dir.exists() and any(self.ckpt_dir.iterdir()):
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            self._aside = self.ckpt_dir.with_name(f"{self.ckpt_dir.name}.replaced-{stamp}")
            os.replace(self.ckpt_dir, self._aside)
            log.info("--fresh: the earlier checkpoints are set aside at %s until this run "
                     "writes its first checkpoint", self._aside)
        self._replacing = distributed.any_rank(self._aside is not None)  # a barrier too

    def _recover_aside(self) -> None:
        """Checkpoints a ``--fresh`` run set aside and could not put back (it was killed
        before its first checkpoint): back in place if the run left none of its own, so
        ``--resume`` and ``gmeta eval`` find them; deleted if it did (its first checkpoint
        is complete, as ``_drop_aside`` would have done)."""
        if self.rank == 0:
            left = sorted(self.ckpt_dir.parent.glob(f"{self.ckpt_dir.name}.replaced-*"))
            good = [d for d in left if checkpoint.latest(d) is not None]
            if good and checkpoint.latest(self.ckpt_dir) is None:
                left.remove(good[-1])
                self._put_back(good[-1], "an earlier --fresh run stopped before its first "
                               "checkpoint")
            if checkpoint.latest(self.ckpt_dir) is None:
                left = []  # nothing known good here: every set-aside directory stays
            for stale in left:
                shutil.rmtree(stale, ignore_errors=True)
                log.info("deleted %s, set aside by an earlier --fresh run that wrote "
                         "checkpoints of its own", stale)
        distributed.barrier()

    def _drop_aside(self) -> None:
        """After the first checkpoint of a fresh run: the set-aside one goes, and so do
        the earlier run's results from beside this run's (``_set_earlier_results_aside``)."""
        if self.rank == 0 and self._aside is not None:
            shutil.rmtree(self._aside, ignore_errors=True)
            log.info("--fresh: deleted the earlier checkpoints %s", self._aside)
        if self.rank == 0 and self._earlier:
            self._set_earlier_results_aside()
        self._aside, self._earlier = None, []

    def _earlier_results(self) -> list[Path]:
        """What an earlier run left in ``run_dir`` that a run from step 0 would be read
        beside: the results ``gmeta eval`` wrote (``eval/*.json``, naming steps and
        checkpoint paths this run writes again) and the TensorBoard event files."""
        found = []
        for folder, pattern in ((self.config.eval_dir, "*.json"),
                                (self.config.tensorboard_dir, "events.out.tfevents.*")):
            if os.path.isdir(folder):
                found += sorted(p for p in Path(folder).glob(pattern) if p.is_file())
        return found

    def _set_earlier_results_aside(self) -> None:
        """At this run's first checkpoint (the earlier checkpoints are gone or were never
        there): the earlier run's results move to ``replaced-<time>/`` in their folder,
        kept, so ``eval/`` holds results of the checkpoints beside it and TensorBoard shows
        the earlier run's curves as a run of that name instead of under this one's."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        moved = []
        for file in self._earlier:
            if file.is_file():
                kept = file.parent / f"replaced-{stamp}"
                kept.mkdir(exist_ok=True)
                os.replace(file, kept / file.name)
                moved.append(file)
        for folder in sorted({f.parent for f in moved}):
            names = [f.name for f in moved if f.parent == folder]
            log.info("the earlier run's %s (%s) are kept at %s",
                     "evaluation results" if folder == Path(self.config.eval_dir) else
                     "TensorBoard events", ", ".join(names) if len(names) <= 3 else
                     f"{len(names)} files", folder / f"replaced-{stamp}")

    def _restore_aside(self) -> None:
        """A fresh run that failed before its first checkpoint: the old one comes back."""
        if self.rank != 0 or self._aside is None:
            return
        if checkpoint.latest(self.ckpt_dir) is None:
            self._put_back(self._aside, "this run failed before its first checkpoint")
        self._aside = None

    def _put_back(self, aside: Path, why: str) -> None:
        """Checkpoints a ``--fresh`` run set aside, back in place of a checkpoint directory
        that holds no complete checkpoint (call it on one rank)."""
        shutil.rmtree(self.ckpt_dir, ignore_errors=True)
        os.replace(aside, self.ckpt_dir)
        log.warning("%s: the earlier checkpoints are back in place from %s, at %s", why,
                    aside, self.ckpt_dir)

    def _batches(self, start_step: int, is_meta: bool) -> Iterator[dict]:
        d, t = self.config.data, self.config.train
        dataset = meta_io.TaskDataset(d.path, "warm", reader=d.reader, verify="size")
        if not is_meta:  # a plain CTR model: every warm row, row batches
            rows = dataset.rows(d.batch_size, shuffle_seed=t.shuffle_seed, epochs=None)
            return iter(rows.skip(start_step))
        batches = dataset.tasks(d.tasks_per_batch, d.support, d.query,
                                shuffle_seed=t.shuffle_seed, epochs=None, equal_steps=True,
                                resplit=t.resplit)
        # The stream is a pure function of (seed, rank, world size): skipping the steps
        # already taken gives a resumed run the batches an uninterrupted run at this
        # world size takes from start_step on.
        return iter(batches.skip(start_step))

    def _step_function(self, models: Models, resting: frozenset = frozenset()):
        """One training step of every model not in ``resting`` (models that diverged or ran
        out of patience)."""
        model = models.model
        baseline = models.baseline if "baseline" not in resting else None
        trains_model = "model" not in resting

        def make_step(model_step):
            @graph_function(reduce_retracing=True)
            def step(batch):
                out = model_step(batch) if trains_model else {}
                if baseline is not None:
                    out["baseline_loss"] = baseline.train_step(task_rows(batch))["loss"]
                return out
            return step

        @graph_function(reduce_retracing=True)
        def ctr_step(rows):
            return model.train_step(rows)

        if not models.is_meta:
            return lambda step, rows: ctr_step(rows)
        meta_step = make_step(model.train_step)
        pretrain = self.config.train.pretrain_steps
        if not pretrain:
            return lambda step, batch: meta_step(batch)
        pretrain_step = make_step(model.pretrain_step)
        model.pretrained_steps = pretrain  # before the meta step is traced
        return lambda step, batch: (pretrain_step if step <= pretrain else meta_step)(batch)

    def _sync_steps(self, models: Models, meter: "_Meter"):
        """Trains steps ``done+1..stop`` one by one (the plain synchronous step), each model
        still training (``_resting``: not diverged, patience not run out)."""
        step_fns: dict[frozenset, Callable] = {}

        def train(batches: Iterator[dict], done: int, stop: int,
                  vote: StopVote) -> tuple[dict, int, bool]:
            resting = self._resting()
            if resting not in step_fns:
                step_fns[resting] = self._step_function(models, resting)
            step_fn = step_fns[resting]
            out = {}
            for step in range(done + 1, stop + 1):
                batch = next(batches)
                out = step_fn(step, batch)
                meter.add(_real_rows(batch))
                _rebalance_caches(models, step)
                if vote.after_step():
                    return out, step, True
            return out, stop, False

        return train

    def _hybrid_steps(self, models: Models, meter: "_Meter"):
        """Trains steps ``done+1..stop`` through a HybridTrainer; returns with every update
        of those steps applied. Returns ``(train, trainer)``."""
        model = models.model
        if models.is_meta:  # check_consistency refuses this config already
            raise ConfigError("config key 'train.hybrid' is not allowed with meta.enabled: true")
        tower, head, embedding = model.tower, model.head, model.embedding
        names = [f.name for f in embedding.feature_configs]

        def loss_fn(embedded, rows):  # CTRModel._loss on pulled rows
            tasks = rows[TASK_COLUMN] if tower.out_of_fold else None
            labels = tf.cast(rows[head.label], tf.float32)
            return model.rows_loss({**embedded, **tower.raw_inputs(rows, tasks)}, labels,
                                   training=True)

        @graph_function(reduce_retracing=True)
        def to_rows(rows):  # the CTR step's input, multi-hot ids as ragged
            return {**rows, **embedding_inputs(rows, names)}

        trainer = HybridTrainer(embedding, loss_fn, dense_slow_variables(model),
                                models.optimizers.model, staleness=self.config.train.hybrid
                                .staleness)

        def train(batches: Iterator[dict], done: int, stop: int,
                  vote: StopVote) -> tuple[dict, int, bool]:
            def feed():  # runs in the trainer's embedding thread
                for _ in range(done, stop):
                    batch = next(batches)
                    meter.add(_real_rows(batch))
                    yield to_rows(batch)

            trainer.fit(feed())  # returns with every pull's update applied
            loss = trainer.losses[-1] / model.members
            trainer.losses.clear()
            return {"loss": loss}, stop, False  # the loop votes before the next steps

        return train, trainer

    def _stops(self, start: int) -> Iterator[int]:
        """The steps after which the loop logs, evaluates or checkpoints, in order."""
        t = self.config.train
        for step in range(start + 1, t.steps + 1):
            if (step % t.log_every == 0 or step == t.steps
                    or (t.eval_every and step % t.eval_every == 0)
                    or (t.checkpoint_every and step % t.checkpoint_every == 0)):
                yield step

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> TrainResult:
        """Trains to ``train.steps``; returns (and on rank 0 writes) the run's summary."""
        models = build_models(self.config, self.placement)
        self._check_inputs()
        start = self._start_step(models)
        set_configured_blend(models, self.config)  # over a restored checkpoint's
        try:
            prior = models.model.tower.prior
            if prior is not None and not prior.fitted:  # a resumed run restored it
                fit_prior(prior, self.config)
                if start == 0 and getattr(models.model, "ridge_variable", None) is not None:
                    # the learned strengths start where the baseline's stay (initial_ridge)
                    models.model.set_ridge_strengths(
                        initial_ridge(models.model.tower, self.config.meta.ridge)().numpy())
            if start == 0:  # a resumed run restores the scaling with its checkpoint
                fit_dense_scaling(models, self.config)
            if start == 0 and self.config.model.start_from_linear:
                start_from_linear(models, self.config)
            # Ctrl-C and SIGTERM stop it after a step, every rank after the same one, with
            # a checkpoint there (``_stop_here``)
            with interrupts.deferred(), interrupts.held():
                return self._run(models, start)
        except BaseException:
            self._restore_aside()
            raise

    def _run(self, models: Models, start: int) -> TrainResult:
        config, t = self.config, self.config.train
        if start == 0:
            variables = dense_slow_variables(models.model)
            if models.baseline is not None:
                variables += dense_slow_variables(models.baseline)
            distributed.broadcast_variables(variables)
        self._write_config()
        batches = self._batches(start, models.is_meta)
        patience_from = t.pretrain_steps if models.is_meta else 0
        protocol = validation_protocol(
            t.validation_split, t.valid_resplits,
            split_rows(meta_io.Manifest.load(config.data.path), t.validation_split)
            if t.eval_every else None)
        selection = Selection.load(self.ckpt_dir, selection_metric(config), t.patience,
                                   up_to_step=start, patience_from=patience_from,
                                   protocol=protocol) if start else \
            Selection(selection_metric(config), t.patience, patience_from, protocol)
        # A model that diverged before the checkpoint resumed from stays stopped (its weights
        # there are its best checkpoint's); selection.halted is saved with BEST.json. One
        # whose patience ran out stays stopped too (the replayed history says so).
        self._selection = selection
        halted = selection.halted
        if halted:
            log.info("resumed: the %s stopped training at step %s (not finite) and stays "
                     "at its best checkpoint", " and the ".join(halted),
                     ", ".join(str(s) for s in halted.values()))
        finished = {n: s for n, s in selection.finished.items() if n not in halted}
        if finished:
            log.info("resumed: the %s stopped training at step %s (no better validation in "
                     "%d evaluations)", " and the ".join(finished),
                     ", ".join(str(s) for s in finished.values()), t.patience)
        tensorboard = _Scalars(config.tensorboard_dir if self.rank == 0 else None)
        bar = ProgressBar(t.steps, start, enabled=self.rank == 0)
        self._cache_base = self._cache_totals(models)
        meter = _Meter()
        hybrid = None
        if t.hybrid is not None:
            train, hybrid = self._hybrid_steps(models, meter)
        else:
            train = self._sync_steps(models, meter)
        last_ckpt, eval_metrics, stopped = None, {}, None
        # Each model's loss at its last training step: a model that stopped early keeps
        # the loss it stopped with, not NaN (the summary's final_loss, the last log line).
        last_losses: dict = {}
        log.info("training %s from step %d to %d on %d rank(s), devices: tables %s, dense %s%s",
                 config.name, start, t.steps, self.size, self.placement.tables,
                 self.placement.dense, f", hybrid (staleness {hybrid.staleness})" if hybrid else "")
        tuned_at = tuned_world_size(config.run_dir)
        if tuned_at is not None and tuned_at != self.size:
            log.warning("the settings in %s/tuned.yaml were tuned at %d rank(s) and train at "
                        "%d: a step's batch is data.%s per rank, so this step's batch is not "
                        "the one they were chosen for; gmeta tune --np %d tunes at this size",
                        config.run_dir, tuned_at, self.size,
                        "tasks_per_batch" if models.is_meta else "batch_size", self.size)
        if models.is_meta and t.pretrain_steps > start:
            log.info("steps %d to %d pre-train the meta model on every row of their tasks "
                     "(train.pretrain_steps); meta-training follows", start + 1,
                     min(t.pretrain_steps, t.steps))
        self._keep_initial(models, start)
        if start == 0 and config.model.start_from_linear and t.eval_every:
            # validated before its first step: the linear model is a candidate checkpoint
            eval_metrics, improved = self._validate(0, models, tensorboard, selection)
            if improved:
                last_ckpt = self._save(models, 0, selection)
        done = start
        stops = self._stops(start)
        if all(n in self._resting() for n in models.names):
            why = [f"the {n} at step {selection.halted[n]} (not finite)" if n in
                   selection.halted else f"the {n} at step {selection.finished[n]} (no "
                   f"better validation in {t.patience} evaluations)" for n in models.names]
            log.warning("every model stopped training before step %d: %s; nothing to train, "
                        "each keeps its best checkpoint on validation", start, ", ".join(why))
            stops, stopped = [], start
        vote = StopVote()
        for step in stops:
            # a vote at every log, validation or checkpoint step (the hybrid step's only
            # one) and, in the plain step, every few steps between
            if vote.now():
                self._stop_here(models, start, done, last_ckpt, selection, bar)
            out, done, stopping = train(batches, done, step, vote)
            last_losses.update(out)
            if stopping:  # every rank stops after step ``done``
                self._stop_here(models, start, done, last_ckpt, selection, bar)
            logs = step % t.log_every == 0 or step == t.steps
            validates = bool(t.eval_every) and (step % t.eval_every == 0 or step == t.steps)
            if logs:
                self._report(step, out, models, meter, bar, tensorboard, hybrid)
            with meter.paused():  # samples/s counts training time only
                diverged = self._diverged(out) if logs or validates else {}
                diverged = {n: loss for n, loss in diverged.items() if n not in halted}
                if diverged:
                    halted.update({n: step for n in diverged})
                    if self.rank == 0:
                        selection.save(self.ckpt_dir)
                    running = [n for n in models.names if n not in self._resting()]
                    what = " and the ".join(diverged.values())
                    if not running or not self._rewind(models, list(diverged), selection):
                        log.warning("step %d: not finite: the %s (training diverged); training "
                                    "stops here and each model keeps its best checkpoint on "
                                    "validation", step, what)
                        stopped = step
                        break
                    back = [f"the {n} to its best checkpoint on validation (step "
                            f"{selection.best[n].step})" if n in selection.best else
                            f"the {n} to its weights before training (it diverged before "
                            f"its first validation)" for n in diverged]
                    log.warning("step %d: not finite: the %s (training diverged); the %s "
                                "stops training here, put back: %s; the %s trains on", step,
                                what, " and the ".join(diverged), ", ".join(back),
                                " and the ".join(running))
                improved, was_resting = [], self._resting()
                if validates:
                    eval_metrics, improved = self._validate(step, models, tensorboard,
                                                            selection)
                if improved or (t.checkpoint_every and step % t.checkpoint_every == 0):
                    last_ckpt = self._save(models, step, selection)
                out_of_patience = [n for n in models.names
                                   if n in self._resting() and n not in was_resting]
                if selection.should_stop([n for n in models.names if n not in halted]):
                    stopped = step
                    stopping = out_of_patience or models.names
                    log.info("early stopping at step %d: the %s %s not improved %s "
                             "validation %s in %d evaluations%s; no model is left training",
                             step, " and the ".join(stopping),
                             "has" if len(stopping) == 1 else "have",
                             "its" if len(stopping) == 1 else "their",
                             selection.metric, t.patience,
                             self._linear_start_kept(stopping, selection))
                    break
                if out_of_patience:
                    log.info("step %d: the %s has not improved its validation %s in %d "
                             "evaluations%s: it stops training here (best at step %s); the %s "
                             "trains on", step, " and the ".join(out_of_patience),
                             selection.metric, t.patience,
                             self._linear_start_kept(out_of_patience, selection),
                             ", ".join(str(selection.best[n].step) for n in out_of_patience
                                       if n in selection.best),
                             " and the ".join(n for n in models.names
                                              if n not in self._resting()))
        bar.close()
        self._drop_initial()
        if done == start and start:
            # Nothing trained since the checkpoint this run resumed from (a finished run,
            # or every model stopped; a start past 0 is always a restored step): it is the
            # last one, not written again in place.
            last_ckpt = self.ckpt_dir / f"ckpt-{start}"
        elif last_ckpt is None or not last_ckpt.name.endswith(f"-{done}"):
            last_ckpt = self._save(models, done, selection)
        for name, best in sorted(selection.best.items()):
            log.info("best checkpoint of the %s: step %d (validation %s %.4f)", name, best.step,
                     selection.metric, best.value)
        result = self._result(start, models, meter, last_losses, last_ckpt, eval_metrics,
                              hybrid, selection, stopped)
        tensorboard.close()
        return result

    def _stop_here(self, models: Models, start: int, done: int, last_ckpt: Path | None,
                   selection: Selection, bar: ProgressBar) -> NoReturn:
        """Ctrl-C or SIGTERM came to a rank: every rank is here after the same step
        ``done``. A checkpoint of that step is written (unless one is, or nothing trained,
        or this ``--fresh`` run has not yet replaced the checkpoints it set aside: they
        come back), so ``--resume`` goes on from this step; then the signal is raised."""
        bar.close()
        pending = interrupts.pending()
        how = interrupts.name_of(pending) if pending else "a signal to another rank"
        if self._replacing:
            log.warning("stopped by %s after step %d: no checkpoint is written (this --fresh "
                        "run has written none, and the earlier run's come back)", how, done)
        elif done == start:
            log.warning("stopped by %s at step %d, before training a step: nothing new to "
                        "keep", how, done)
        elif last_ckpt is not None and last_ckpt.name == f"ckpt-{done}":
            log.warning("stopped by %s after step %d on every rank, whose checkpoint %s is "
                        "written", how, done, last_ckpt)
        else:
            path = self._save(models, done, selection)
            log.warning("stopped by %s after step %d on every rank: checkpoint %s written; "
                        "the same command with --resume goes on from it", how, done, path)
        interrupts.raise_pending()

    def _resting(self) -> frozenset:
        """The models that train no more: diverged, or out of patience."""
        s = self._selection
        return frozenset(s.halted) | frozenset(s.finished) if s is not None else frozenset()

    def _rewind(self, models: Models, names: list[str], selection: Selection) -> bool:
        """Puts each named (diverged) model and its optimizer back to its best checkpoint on
        validation, in place, so the run's later checkpoints hold finite weights for it
        while the other model trains on; one that diverged before its first validation
        goes back to its weights before training (``_keep_initial``). False, changing
        nothing, when one has neither (a run resumed without them)."""
        unvalidated = [n for n in names if n not in selection.best]
        if unvalidated and self._initial is None:
            log.warning("the %s diverged before its first validation: it has no checkpoint to "
                        "keep", " and the ".join(unvalidated))
            return False
        for name in names:
            state, optimizer = tf.Module(name="state"), tf.Module(name="optimizers")
            setattr(state, name, getattr(models.state, name))
            setattr(optimizer, name, getattr(models.optimizers, name))
            source = (self._initial if name in unvalidated
                      else self.ckpt_dir / f"ckpt-{selection.best[name].step}")
            checkpoint.restore(source, state, optimizer)
        return True

    def _keep_initial(self, models: Models, start: int) -> None:
        """With two models validated, saves their weights before training beside the
        checkpoints (``checkpoints.initial``; not a checkpoint of the run: never resumed
        from, and not counted as a first checkpoint by ``--fresh``). A resumed run uses the
        one its first attempt left, when there is one."""
        t = self.config.train
        if not t.eval_every or len(models.names) < 2:
            return
        if start == 0:
            self._initial = checkpoint.save(self._initial_root, models.state, 0,
                                            models.optimizers)
        elif (self._initial_root / "ckpt-0" / checkpoint.MANIFEST).is_file():
            self._initial = self._initial_root / "ckpt-0"

    def _drop_initial(self) -> None:
        """The weights before training go when the run ends (every rank has passed the
        last step that could need them)."""
        distributed.barrier()
        if self.rank == 0 and self._initial is not None:
            shutil.rmtree(self._initial_root, ignore_errors=True)
        self._initial = None

    def _diverged(self, out: dict) -> dict[str, str]:
        """The models ("model", "baseline") with a loss that is NaN or infinite on any rank,
        each with the losses named (a collective: call it at the same steps on every
        rank)."""
        names = sorted(k for k in out if k.endswith("loss"))
        bad = np.array([0.0 if np.isfinite(float(out[k])) else 1.0 for k in names])
        total = distributed.sum_over_ranks(bad) if names else bad
        labels = {"loss": "model's loss", "baseline_loss": "baseline's loss"}
        diverged: dict[str, list[str]] = {}
        for n, b in zip(names, total):
            if b > 0:
                model = "baseline" if n.startswith("baseline") else "model"
                diverged.setdefault(model, []).append(labels.get(n, n))
        return {m: " and the ".join(losses) for m, losses in diverged.items()}

    def _report(self, step: int, out: dict, models: Models, meter: "_Meter", bar: ProgressBar,
                tensorboard: "_Scalars", hybrid: HybridTrainer | None = None) -> None:
        losses = {k: float(v) for k, v in out.items()}
        names = sorted(losses)
        mean = distributed.sum_over_ranks(np.array([losses[k] for k in names])) / self.size
        losses = dict(zip(names, mean))
        samples, seconds = meter.since_last()
        samples = float(distributed.sum_over_ranks(np.array([samples]))[0])
        rate = samples / max(seconds, 1e-9)
        sizes = self._table_rows(models)
        alltoall = self._alltoall_bytes()
        bar.update(step, rate, {k: losses[k] for k in ("loss", "baseline_loss") if k in losses})
        scalars = {**{f"train/{k}": v for k, v in losses.items()},
                   "train/samples_per_sec": rate,
                   "collectives/alltoall_bytes_total": alltoall,
                   **{f"tables/{k}_rows": v for k, v in sizes.items()}}
        notes = []
        caches = self._cache_totals(models)
        for table, now in caches.items():  # hit rate of the steps since the last report
            base = self._cache_base.get(table, {})
            lookups = now["lookups"] - base.get("lookups", 0.0)
            hit_rate = (now["hits"] - base.get("hits", 0.0)) / lookups if lookups else 0.0
            scalars[f"cache/{table}_hit_rate"] = hit_rate
            scalars[f"cache/{table}_size"] = now["size"]
            notes.append(f"cache {table} hit rate {hit_rate:.3f} ({int(now['size'])} rows "
                         f"cached)")
        self._cache_base = caches
        if hybrid is not None:
            stale = self._staleness(hybrid)
            scalars["hybrid/staleness_max"] = stale["staleness_max"]
            scalars["hybrid/staleness_mean"] = stale["staleness_mean"]
            notes.append(f"staleness max {stale['staleness_max']} mean "
                         f"{stale['staleness_mean']:.2f} (bound {hybrid.staleness})")
        if notes:
            log.info("step %d: %s", step, "; ".join(notes))
        tensorboard.write(step, scalars)

    def _cache_totals(self, models: Models) -> dict[str, dict[str, float]]:
        """Each cached table's MixCache counters summed over ranks, and its hit rate."""
        stats = models.model.embedding.cache_stats()  # the same tables on every rank
        if not stats:
            return {}
        names, keys = sorted(stats), _CACHE_COUNTERS
        total = distributed.sum_over_ranks(
            np.array([[stats[n][k] for k in keys] for n in names], np.float64).reshape(-1))
        out = {}
        for i, name in enumerate(names):
            counters = dict(zip(keys, (float(v) for v in total[i * len(keys):(i + 1) * len(keys)])))
            counters["hit_rate"] = (counters["hits"] / counters["lookups"]
                                    if counters["lookups"] else 0.0)
            out[name] = counters
        return out

    def _staleness(self, trainer: HybridTrainer) -> dict:
        """The trainer's staleness figures over all ranks (a collective: call on every rank)."""
        metrics = trainer.metrics()
        hist = distributed.sum_over_ranks(np.array(metrics["staleness_hist"], np.int64))
        seconds = distributed.sum_over_ranks(np.array(
            [metrics["wait_for_rows_s"], metrics["dense_s"], metrics["cache_rebalance_s"]],
            np.float64)) / self.size
        seen = np.flatnonzero(hist)
        batches = int(hist.sum())
        return {"staleness_bound": trainer.staleness,
                "staleness_max": int(seen.max()) if seen.size else 0,
                "staleness_mean": float((hist * np.arange(hist.size)).sum() / batches)
                if batches else 0.0,
                "staleness_hist": [int(v) for v in hist],
                "wait_for_rows_s": float(seconds[0]), "dense_s": float(seconds[1]),
                "cache_rebalance_s": float(seconds[2])}

    def _linear_start_kept(self, names: list[str], selection: Selection) -> str:
        """What "improved" meant for those of ``names`` whose best is still the linear start
        (``train.linear_margin``): a clause for the log, empty for the others."""
        kept = [n for n in names if n in selection.best and selection.best[n].step == 0]
        if not kept or not guards_linear_start(self.config):
            return ""
        return (f" (the {' and the '.join(kept)} still at the linear start, step 0, which a "
                f"checkpoint replaces only when better by more than "
                f"train.linear_margin = {self.config.train.linear_margin:g} standard errors)")

    def _validate(self, step: int, models: Models, tensorboard: "_Scalars",
                  selection: Selection) -> tuple[dict[str, float], list[str]]:
        """Scores the models on the validation split; returns the main model's metrics and
        the models that improved on their best."""
        split = self.config.train.validation_split
        if self._validator is None:
            self._validator = Validator(models, self.config)
        results = self._validator(skip=self._resting(), step=step)
        if not results:
            log.warning("step %d validation: the %s split has no rows; nothing scored",
                        step, split)
            return {}, []
        improved = selection.update(step, results)
        parts = []
        for name, metrics in results.items():
            best = selection.best.get(name)
            margin = metrics.get("linear_margin")
            if name in improved:
                mark = "best"
            elif best and best.step == 0 and margin is not None:
                mark = (f"best {best.value:.4f} at step 0, the linear start, which a checkpoint "
                        f"replaces only when better by more than {margin:.4f}: "
                        f"train.linear_margin standard errors")
            else:
                mark = f"best {best.value:.4f} at step {best.step}" if best else "no best yet"
            shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()
                              if k not in ("rows", "tasks", "linear_margin"))
            parts.append(f"{name}: {shown} ({mark})")
            tensorboard.write(step, {f"validation/{name}/{k}": v for k, v in metrics.items()})
        main = results.get("model", {})
        shown = main or next(iter(results.values()))
        tasks = int(shown.get("tasks", 0))  # row data (a plain model's) counts rows alone
        log.info("step %d validation (%s split, %s%d rows) on %s: %s", step, split,
                 f"{tasks} tasks, " if tasks else "", int(shown.get("rows", 0)),
                 selection.metric, "; ".join(parts))
        if self.rank == 0 and not improved:  # a new best is recorded once it is saved
            selection.save(self.ckpt_dir)
        return main, improved

    def _table_rows(self, models: Models) -> dict[str, int]:
        sizes = models.model.embedding.table_sizes()
        names = sorted(sizes)
        total = distributed.sum_over_ranks(np.array([sizes[n] for n in names], np.float64))
        return {n: int(round(v)) for n, v in zip(names, total)}

    def _alltoall_bytes(self) -> float:
        """All-to-all payload bytes (forward and backward) sent by all ranks so far."""
        counts = distributed.collective_counts()
        mine = counts["alltoall_bytes"] + counts["alltoall_grad_bytes"]
        return float(distributed.sum_over_ranks(np.array([mine], np.float64))[0])

    def _save(self, models: Models, step: int, selection: Selection) -> Path:
        """Checkpoints, records the selection (``BEST.json`` names a best step only once its
        checkpoint is complete, and never one already pruned), then prunes all but the
        newest ``train.keep_checkpoints`` and each model's best (``checkpoint.prune``:
        renamed before deletion, crash-safe)."""
        path = checkpoint.save(self.ckpt_dir, models.state, step, models.optimizers)
        log.info("checkpoint %s", path)
        self._drop_aside()
        self._replacing = False
        if self.rank == 0:
            if selection.history or selection.halted:  # a run without validation has none
                selection.save(self.ckpt_dir)
            checkpoint.prune(self.ckpt_dir, self.config.train.keep_checkpoints,
                             protect=selection.protected_steps)
        distributed.barrier()
        return path

    def _write_config(self) -> None:
        if self.rank == 0:
            os.makedirs(self.config.run_dir, exist_ok=True)
            dump_config(self.config, os.path.join(self.config.run_dir, "config.yaml"))

    def _result(self, start: int, models: Models, meter: "_Meter", out: dict, ckpt: Path,
                eval_metrics: dict, hybrid: HybridTrainer | None, selection: Selection,
                stopped: int | None) -> TrainResult:
        samples = float(distributed.sum_over_ranks(np.array([meter.total], np.float64))[0])
        loss = float(distributed.sum_over_ranks(
            np.array([float(out.get("loss", np.nan))]))[0]) / self.size
        baseline = None
        if "baseline_loss" in out:
            baseline = float(distributed.sum_over_ranks(np.array([float(out["baseline_loss"])]))[0]
                             ) / self.size
        end = stopped if stopped is not None else self.config.train.steps
        steps = end - start
        if steps == 0 and self.rank == 0:  # nothing trained: the losses the models stopped with
            loss, baseline = self._previous_losses(loss, baseline)
        result = TrainResult(start, end, meter.elapsed, int(samples), loss,
                             baseline, str(ckpt), self.size, self._table_rows(models),
                             self._alltoall_bytes() / max(steps, 1), eval_metrics,
                             self._staleness(hybrid) if hybrid is not None else None,
                             self._cache_totals(models),
                             {n: dataclasses.asdict(b) for n, b in selection.best.items()},
                             stopped, dict(selection.halted),
                             {n: s for n, s in selection.finished.items()
                              if n not in selection.halted})
        if self.rank == 0:
            summary = {**dataclasses.asdict(result), "samples_per_sec": result.samples_per_sec,
                       "machine": machine()}  # rank 0's: the figures depend on the CPU
            write_text_atomically(Path(self.config.run_dir, SUMMARY_FILE),
                                  json.dumps(summary, indent=1))
            log.info("done: %d steps in %.1fs, %.0f samples/s, loss %.4f, checkpoint %s",
                     steps, result.seconds, result.samples_per_sec, loss, ckpt)
            if result.hybrid is not None:
                log.info("hybrid: staleness bound %d, max %d, mean %.2f, batches by staleness "
                         "%s (all ranks); waited %.1fs for rows", result.hybrid["staleness_bound"],
                         result.hybrid["staleness_max"], result.hybrid["staleness_mean"],
                         result.hybrid["staleness_hist"], result.hybrid["wait_for_rows_s"])
            for table, counters in result.cache.items():
                log.info("cache %s: hit rate %.3f (%d of %d id lookups), %d rows cached",
                         table, counters["hit_rate"], counters["hits"], counters["lookups"],
                         counters["size"])
        return result

    def _previous_losses(self, loss: float, baseline: float | None
                         ) -> tuple[float, float | None]:
        """The final losses of the run's previous summary (a resume with nothing left to
        train reports the losses its models stopped with), else those given."""
        try:
            previous = json.loads(Path(self.config.run_dir, SUMMARY_FILE).read_text())
        except (OSError, ValueError):
            return loss, baseline
        if not isinstance(previous, dict):
            return loss, baseline
        found, found_baseline = previous.get("final_loss"), previous.get("baseline_loss")
        number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
        return (float(found) if number(found) else loss,
                float(found_baseline) if number(found_baseline) else baseline)


_CACHE_COUNTERS = ("hits", "lookups", "size", "capacity", "admitted", "evicted")


def _rebalance_caches(models: Models, step: int) -> None:
    """The synchronous step's cache re-fills (HybridTrainer does its own), for the model
    and the baseline trained beside it."""
    for model in (models.model, models.baseline):
        if model is not None:
            model.embedding.rebalance_caches(step)


def _real_rows(batch: dict) -> int:
    if "support" not in batch:  # a row batch
        return int(batch["task_id"].shape[0])
    return int(sum(float(tf.reduce_sum(batch[r]["mask"])) for r in ("support", "query")))


class _Meter:
    """Counts samples and time, in total and since the last report."""

    def __init__(self) -> None:
        self.total = 0
        self._since = 0
        self._paused = 0.0
        self._start = self._last = time.perf_counter()

    def add(self, samples: int) -> None:
        self.total += samples
        self._since += samples

    def since_last(self) -> tuple[int, float]:
        now = time.perf_counter()
        out = (self._since, now - self._last)
        self._since, self._last = 0, now
        return out

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside does not count (evaluation, checkpoints)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - began
            self._last += spent
            self._paused += spent

    @property
    def elapsed(self) -> float:
        """Training seconds so far."""
        return time.perf_counter() - self._start - self._paused


class _Scalars:
    """TensorBoard scalars (rank 0 only; a no-op elsewhere)."""

    def __init__(self, log_dir: str | None) -> None:
        self.writer = tf.summary.create_file_writer(log_dir) if log_dir else None

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if self.writer is None:
            return
        with self.writer.as_default(step=step):
            for name, value in scalars.items():
                tf.summary.scalar(name, float(value))
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
