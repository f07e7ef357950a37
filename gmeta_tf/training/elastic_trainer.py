"""``gmeta train --elastic``: the training loop of ``gmeta train`` under Horovod elastic,
where hosts may leave or join while the job runs.

Launch with a host discovery script (``scripts/discover_hosts.sh`` prints the lines of
``$GMETA_HOSTS_FILE``, one ``host:slots`` a line; edit that file to add or remove hosts)::

    GMETA_HOSTS_FILE=hosts.txt horovodrun -np 2 --min-np 1 --max-np 2 \\
        --host-discovery-script scripts/discover_hosts.sh --network-interface eth0 \\
        --gloo-timeout-seconds 60 gmeta train --config default --elastic

A *commit* is a checkpoint of ``run_dir`` (every ``train.checkpoint_every`` steps): every
rank writes its table shard, rank 0 the dense weights and the manifest last. At each
commit the job looks for host changes; after a host left, joined or died every rank points
its sharded tables at the new world size and re-imports them from the last good commit
(keeping the ids it now owns), with the dense weights, optimizer slots and step of that
commit, re-reads its share of the tasks under the new world size and re-traces its step.
Work since the commit is redone, so no committed row is lost.

An elastic job always continues from the newest good checkpoint of ``run_dir`` (a worker
that joins later runs the same command line): ``--fresh`` is refused. The hybrid step is
not elastic (its pull thread runs ahead of commits): ``train.hybrid`` is refused too.
Validation, best-checkpoint selection and early stopping (``train.eval_every``) are not
run in an elastic job: run ``gmeta eval`` on its checkpoints.
"""

from __future__ import annotations

import logging
import time

from gmeta_tf import distributed, elastic, interrupts
from gmeta_tf.config import ConfigError, PipelineConfig
from gmeta_tf.training.dense_scaling import fit_dense_scaling
from gmeta_tf.training.evaluation import selection_metric
from gmeta_tf.training.model_builder import build_models
from gmeta_tf.training.progress import ProgressBar
from gmeta_tf.rank_logging import setup_logging
from gmeta_tf.training.selection import Selection
from gmeta_tf.training.stop_vote import StopVote
from gmeta_tf.training.trainer import Trainer, TrainResult, _Meter, _Scalars

log = logging.getLogger(__name__)


class ElasticTrainer(Trainer):
    """Trains a pipeline's models while the world size may change (see the module doc).

    Args:
        config: The pipeline config (``train.checkpoint_every`` >= 1: commits are
            checkpoints; no ``train.hybrid``).
    """

    def __init__(self, config: PipelineConfig) -> None:
        if config.train.hybrid is not None:
            raise ConfigError(f"config key 'train.hybrid' = {{'staleness': "
                              f"{config.train.hybrid.staleness}}} is not allowed with "
                              f"--elastic: expected no hybrid section (the hybrid step's pull "
                              f"thread runs ahead of the commits an elastic reset restores)")
        if not config.train.checkpoint_every:
            raise ConfigError(f"config key 'train.checkpoint_every' = "
                              f"{config.train.checkpoint_every} is not allowed with --elastic: "
                              f"expected an integer >= 1 (elastic commits are checkpoints)")
        super().__init__(config, resume=True)
        self.world_sizes: list[tuple[int, int]] = []  # (step, world size) at each (re)start

    def run(self) -> TrainResult:
        config, t = self.config, self.config.train
        # Models are built from shapes (no collective): a rank that joins later runs this
        # alone, before the elastic state syncs it with the others.
        models = build_models(config, self.placement)
        state = elastic.ShardedModelState(models.state, models.optimizers, self.ckpt_dir,
                                          keep=t.keep_checkpoints)
        self._write_config()
        tensorboard = _Scalars(config.tensorboard_dir if self.rank == 0 else None)
        first_start = []
        meter = _Meter()

        @elastic.run
        def train(state: elastic.ShardedModelState) -> dict:
            self.rank, self.size = distributed.rank(), distributed.size()
            setup_logging()  # rank 0 of this world logs (it may be another process now)
            start = state.step
            if start == 0:  # a fresh run (a restored commit holds its scaling, or none)
                fit_dense_scaling(models, config)  # the training split, over every rank
            first_start.append(start)
            self.world_sizes.append((start, self.size))
            log.info("elastic: training %s from step %d to %d on %d rank(s)", config.name,
                     start, t.steps, self.size)
            # This rank's share under the current world size.
            batches = self._batches(start, models.is_meta)
            train_steps = self._sync_steps(models, meter)  # re-traced: the size is baked in
            bar = ProgressBar(t.steps, start, enabled=self.rank == 0)
            self._cache_base = self._cache_totals(models)
            done, out = start, {}
            vote = StopVote()  # this world's ranks
            for step in self._commit_and_log_stops(start):
                out, done, stopping = train_steps(batches, done, step, vote)
                if stopping or vote.now():  # every rank after the same step
                    bar.close()
                    if done > start:
                        state.step = done
                        state.commit()
                        log.warning("stopped after step %d on every rank: commit %s written; "
                                    "the same command goes on from it", done,
                                    self.ckpt_dir / f"ckpt-{done}")
                    interrupts.raise_pending()
                if step % t.log_every == 0 or step == t.steps:
                    self._report(step, out, models, meter, bar, tensorboard)
                if step % t.checkpoint_every == 0 or step == t.steps:
                    with meter.paused():
                        state.step = step
                        began = time.perf_counter()
                        state.commit()  # a checkpoint; raises to reset on a host change
                        log.info("commit at step %d (%.2fs)", step,
                                 time.perf_counter() - began)
            bar.close()
            return out

        # Ctrl-C and SIGTERM stop it after a step, every rank after the same one, with a
        # commit there
        with interrupts.deferred(), interrupts.held():
            out = train(state)
        last = self.ckpt_dir / f"ckpt-{t.steps}"
        result = self._result(first_start[0] if first_start else 0, models, meter, out, last,
                              {}, None, Selection(selection_metric(config)), None)
        tensorboard.close()
        return result

    def _commit_and_log_stops(self, start: int):
        t = self.config.train
        for step in range(start + 1, t.steps + 1):
            if step % t.log_every == 0 or step % t.checkpoint_every == 0 or step == t.steps:
                yield step
