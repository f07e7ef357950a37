"""``gmeta``: one command for a whole pipeline, driven by one YAML config.

Verbs::

    gmeta data prepare --config default          # make the config's dataset (generate/convert)
    gmeta data movielens ../shared/data/ml-100k out/ml   # any gmeta-data command, as is
    gmeta train --np 2 --config default [--resume | --fresh]   # runs horovodrun for you
    horovodrun -np 2 -H localhost:2 gmeta train --config default   # the same, by hand
    gmeta train --np 2 --config criteo --staleness 2   # hybrid
    gmeta tune --config default --trials 12      # settings chosen on the validation split
    gmeta eval --config default                  # cold-start tasks: meta model vs baseline
    gmeta export --config default                # SavedModel for stock TensorFlow Serving
    gmeta config --config default --set train.steps=10   # print the checked config

``--config`` takes a YAML file or the name of a ready pipeline in ``pipelines/``
(default: ``default``); ``--set key.sub=value`` (repeatable) overrides any key. Bad
configs exit with status 2 and a message naming the key, the value and what is allowed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
from typing import TYPE_CHECKING, Sequence

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from gmeta_tf import interrupts  # noqa: E402
from gmeta_tf.config_fields import ConfigError  # noqa: E402 (no TensorFlow in it)
from gmeta_tf.data.errors import DataError  # noqa: E402 (no TensorFlow in it)
from gmeta_tf.rank_logging import setup_logging  # noqa: E402 (no TensorFlow in it)

if TYPE_CHECKING:
    from gmeta_tf.config import PipelineConfig

# TensorFlow is imported (through the config) only once the arguments are parsed: `--help`
# and a usage error answer at once, without TensorFlow's start-up lines.

log = logging.getLogger("gmeta")
VERBS = ("train", "tune", "eval", "export", "data", "config")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gmeta", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    sub = parser.add_subparsers(dest="verb", required=True)
    train = _with_config(sub.add_parser("train", help="train (under horovodrun for many ranks)"))
    group = train.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true",
                       help="continue from the latest checkpoint of run_dir")
    group.add_argument("--fresh", action="store_true",
                       help="start from scratch: after the config and data are checked, "
                            "run_dir's checkpoints are set aside and deleted once this run "
                            "has its first checkpoint (moved back if it fails before)")
    train.add_argument("--np", type=int, metavar="N",
                       help="run N ranks under horovodrun (-H localhost:N unless --hosts); "
                            "exits with the ranks' status (2 for bad input) and their message")
    train.add_argument("--hosts", metavar="H",
                       help="horovodrun -H with --np, e.g. host1:8,host2:8")
    train.add_argument("--elastic", action="store_true",
                       help="Horovod elastic training (horovodrun --host-discovery-script "
                            "scripts/discover_hosts.sh --min-np/--max-np): hosts may leave or "
                            "join; continues from run_dir's newest good checkpoint")
    train.add_argument("--staleness", metavar="S",
                       help="hybrid training with embedding lookups up to S batches ahead of "
                            "their updates (same as --set train.hybrid.staleness=S; plain CTR "
                            "models only)")
    tu = _with_config(sub.add_parser(
        "tune", help="choose the meta model's and the baseline's settings on the validation "
                     "split (Optuna), written to <run_dir>/tuned.yaml"))
    tu.add_argument("--trials", type=int, default=12,
                    help="trials per study: the meta model and the baseline get as many "
                         "(default 12)")
    tu.add_argument("--np", dest="np_", type=int, default=1,
                    help="ranks per trial (horovodrun on this host; default 1)")
    tu.add_argument("--patience", type=int, default=3,
                    help="a trial stops after this many validations without improving "
                         "(default 3)")
    tu.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    tu.add_argument("--rechecks", type=int, default=2,
                    help="each study's best N settings are trained again with other seeds "
                         "and chosen by the mean of both runs (default 2; 0: off)")
    tu.add_argument("--resume", action="store_true",
                    help="continue the study recorded in <run_dir>/tune/trials.json: its "
                         "trials keep their scores and the study goes on where it stopped "
                         "(the same --config, --set, --seed, --np and --patience; --trials "
                         "may be larger, not smaller)")
    ev = _with_config(sub.add_parser(
        "eval", help="score the cold split and eval data: models, baseline, references"))
    ev.add_argument("--checkpoint", help="checkpoint directory (default: each model's best on "
                                         "validation, else the latest)")
    ev.add_argument("--data", action="append", metavar="PATH",
                    help="score this dataset directory or raw file instead of eval.data "
                         "(repeatable; the eval.split, when set, is scored too); each "
                         "result goes to <run_dir>/eval/<name>.json")
    scored = ev.add_mutually_exclusive_group()
    scored.add_argument("--validation", action="store_true",
                        help="also score the validation split (train.validation_split) the "
                             "same way, first: which model to ship, chosen before the cold "
                             "split is looked at (figures optimistic for every contender: "
                             "checkpoints and settings were chosen on it)")
    scored.add_argument("--validation-only", action="store_true",
                        help="score the validation split alone, not the cold split or eval "
                             "data: for choosing anything (settings, the model to ship) "
                             "without seeing the test figures")
    ex = _with_config(sub.add_parser("export", help="export a SavedModel for serving"))
    ex.add_argument("--checkpoint", help="checkpoint directory (default: the model's best on "
                                         "validation, else the latest)")
    ex.add_argument("--out", help="SavedModel directory, replacing only an earlier export "
                                  "there (default: <export.dir>/<step>, a TF Serving version "
                                  "directory)")
    _with_config(sub.add_parser("config", help="print the checked config as YAML"))
    sub.add_parser("data", help="'prepare' the config's dataset, or any gmeta-data command",
                   add_help=False)
    return parser


def _with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--config", default=None,
                   help="YAML file or ready pipeline name (default: 'default')")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.steps=100 (repeatable)")
    return p


def _prepare_parser() -> argparse.ArgumentParser:
    p = _with_config(argparse.ArgumentParser(prog="gmeta data prepare",
                                             description="make the config's dataset"))
    p.add_argument("--overwrite", action="store_true", help="make it again if it exists")
    return p


# ---- verbs ------------------------------------------------------------------------------

def _config(args: argparse.Namespace) -> PipelineConfig:
    from gmeta_tf.config import load_config

    overrides = list(args.overrides)
    if getattr(args, "staleness", None) is not None:  # checked with the config's other keys
        overrides.append(f"train.hybrid.staleness={args.staleness}")
    return load_config(args.config, overrides)


def _launch(argv: Sequence[str], args: argparse.Namespace) -> int | None:
    """With ``--np N`` (N > 1) outside horovodrun: the ranks' status; else None."""
    if not args.np or args.np == 1 or "HOROVOD_RANK" in os.environ:
        return None
    if args.np < 1:
        raise ConfigError(f"--np {args.np} is not allowed: expected a number of ranks >= 1")
    from gmeta_tf.launcher import run_ranks

    config = _config(args)  # a bad config stops here, before any rank starts
    if not args.elastic:  # and checkpoints the command would train over
        from gmeta_tf.training.trainer import require_resume_or_fresh

        require_resume_or_fresh(config, args.resume, args.fresh)
    rank_argv, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item in ("--np", "--hosts"):
            skip = True
        elif not item.startswith(("--np=", "--hosts=")):
            rank_argv.append(item)
    return run_ranks(rank_argv, args.np, args.hosts)


def run_train(args: argparse.Namespace) -> int:
    from gmeta_tf.training import Trainer
    from gmeta_tf.training.dataset_prep import prepare_on_chief

    config = _config(args)
    if args.elastic:
        from gmeta_tf.training.dataset_prep import dataset_exists
        from gmeta_tf.training.elastic_trainer import ElasticTrainer

        if args.fresh:
            raise ConfigError("--fresh is not allowed with --elastic: an elastic job always "
                              "continues from run_dir's newest good checkpoint (a host that "
                              "joins later runs the same command); delete "
                              f"{config.checkpoint_dir} first to start over")
        if not dataset_exists(config.data.path):  # no collective here: a joining rank is alone
            raise ConfigError(f"--elastic needs the dataset made first: run `gmeta data "
                              f"prepare` (no {config.data.path})")
        ElasticTrainer(config).run()
        return 0
    prepare_on_chief(config)  # makes the dataset, or again if made with other parameters
    trainer = Trainer(config, resume=args.resume, fresh=args.fresh)
    from gmeta_tf.peer_watch import PeerWatch, is_collective_failure

    watch = PeerWatch.start()
    try:
        trainer.run()
    except Exception as err:  # a lost peer: say which host, and what to resume from
        if not is_collective_failure(err):
            raise
        from gmeta_tf import checkpoint

        newest = checkpoint.latest(config.checkpoint_dir)
        log.error("%s. Newest complete checkpoint: %s; restart with --resume (on any number "
                  "of ranks)", watch.describe_failure(err), newest or "none")
        return 1
    finally:
        watch.close()
    return 0


def run_tune(args: argparse.Namespace) -> int:
    from gmeta_tf.training.tuning import tune

    for name, value in (("--trials", args.trials), ("--np", args.np_),
                        ("--patience", args.patience)):
        if value < 1:
            raise ConfigError(f"gmeta tune {name} {value} is not allowed: expected >= 1")
    if args.rechecks < 0:
        raise ConfigError(f"gmeta tune --rechecks {args.rechecks} is not allowed: expected >= 0")
    summary = tune(args.config or "default", list(args.overrides), args.trials, args.np_,
                   args.patience, args.seed, args.rechecks, resume=args.resume)
    print(json.dumps(summary, indent=1))
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from gmeta_tf.training.cold_start import evaluate_pipeline

    for result in evaluate_pipeline(_config(args), args.checkpoint, args.data,
                                    validation=args.validation,
                                    validation_only=args.validation_only):
        chosen = result.get("chosen") or {}
        steps = ", ".join(f"{n} step {c['step']}" for n, c in chosen.items())
        print(f"{result['name']} ({result['file']}; checkpoints: "
              f"{steps or result['checkpoint']})")
        if result["role"] == "validation":
            print("the validation split: checkpoints and settings were chosen on it, so every "
                  "row's figures are optimistic; choose the model to ship here, the cold "
                  "split is a test scored once")
        print(result["table"])
        print()
    return 0


def run_export(args: argparse.Namespace) -> int:
    from gmeta_tf.serving import export_pipeline

    info = export_pipeline(_config(args), args.checkpoint, args.out)
    print(json.dumps({"path": info["path"], "table_rows": info["table_rows"],
                      "signatures": {k: sorted(v["inputs"]) for k, v in
                                     info["signatures"].items()}}))
    return 0


def run_data(argv: Sequence[str]) -> int:
    if argv and argv[0] == "prepare":
        args = _prepare_parser().parse_args(argv[1:])
        from gmeta_tf.data.cli import summary
        from gmeta_tf.training import prepare_dataset

        print(json.dumps(summary(prepare_dataset(_config(args), overwrite=args.overwrite))))
        return 0
    from gmeta_tf.data.cli import main as data_main

    return data_main(list(argv))


def run_config(args: argparse.Namespace) -> int:
    import yaml

    config = _config(args)
    if config.data.source == "csv":  # its column mapping (inline or a file) checked too
        from gmeta_tf.training.dataset_prep import csv_mapping

        csv_mapping(config)
    print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit code (2 for a bad config or bad data)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "data":
        verb_args: argparse.Namespace | None = None
    else:
        verb_args = _parser().parse_args(argv)
    setup_logging(single_process=verb_args is None)  # gmeta data: one process, no Horovod

    with interrupts.handled():  # a kill, docker stop: handled as Ctrl-C
        return _run_verb(argv, verb_args)


def _run_verb(argv: list[str], verb_args: argparse.Namespace | None) -> int:
    try:
        if verb_args is None:
            return run_data(argv[1:])
        with _run_dir_held(verb_args):
            if verb_args.verb == "train":
                launched = _launch(argv, verb_args)
                if launched is not None:
                    return launched
            runner = {"train": run_train, "tune": run_tune, "eval": run_eval,
                      "export": run_export,
                      "config": run_config}[verb_args.verb]
            return runner(verb_args)
    except (ConfigError, DataError, _checkpoint_error()) as err:
        return _bad_input(err)
    except KeyboardInterrupt as err:
        return _interrupted(_command(verb_args), type(err))
    except Exception as err:
        signalled = interrupts.received()
        if signalled is not None:  # TensorFlow's C++ turned the interrupt into this error
            return _interrupted(_command(verb_args), signalled)
        inside = _data_error_inside(err)
        if inside is not None:
            return _bad_input(inside)
        _record_status(1, f"unexpected {type(err).__name__}: {err}")
        raise


def _data_error_inside(err: Exception) -> str | None:
    """The message of a bad-data error raised while tf.data read a batch (a TensorFlow
    error carrying it, with the reader's traceback), or None."""
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(err, tf.errors.OpError):
        return None
    found = re.search(r"\bDataError: (.+)", err.message or "")
    return found.group(1).strip() if found else None


#: What an interrupted command left, and how to go on.
_AFTER_INTERRUPT = {
    "train": "every complete checkpoint is kept; the same command with --resume goes on "
             "from the newest (one stopped while being written is passed over, its "
             "MANIFEST.json, written last, missing)",
    "train --elastic": "every complete commit is kept; the same command goes on from the "
                       "newest",
    "tune": "every finished trial is recorded; the same command with --resume goes on from "
            "them",
}


def _command(verb_args: argparse.Namespace | None) -> str | None:
    """The key of ``_AFTER_INTERRUPT`` for a command: its verb, "train --elastic" for an
    elastic run (which goes on from its newest commit without --resume)."""
    if verb_args is None:
        return None
    return verb_args.verb + (" --elastic" if getattr(verb_args, "elastic", False) else "")


def _interrupted(command: str | None, signal_type: type[KeyboardInterrupt]) -> int:
    """Ctrl-C or SIGTERM (``signal_type``: ``KeyboardInterrupt``, ``interrupts.Terminated``,
    or ``interrupts.PeerStopped`` on a rank that stopped with another): one line saying
    what is kept, not a traceback; status 130 or 143 as a shell's."""
    after = _AFTER_INTERRUPT.get(command or "", "nothing is left half-written (each file "
                                                "and dataset is written whole or not at all)")
    if issubclass(signal_type, interrupts.PeerStopped):
        how = "stopped with another rank, which was interrupted"
    elif issubclass(signal_type, interrupts.Terminated):
        how = "terminated (SIGTERM)"
    else:
        how = "interrupted"
    status = interrupts.exit_status(signal_type)
    print(f"gmeta: {how}: {after}", file=sys.stderr)
    _record_status(status, how)
    # objects the interrupt left half-made (a zip being written, a TensorFlow executor)
    # fail in their finalizers as the process ends: noise after the line above, not news
    sys.unraisablehook = lambda unraisable: None
    return status


def _in_rank() -> bool:
    """Whether this process is a rank that ``gmeta ... --np N`` (or horovodrun) started."""
    return any(e in os.environ for e in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"))


def _run_dir_held(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """``gmeta train`` and ``gmeta tune`` hold their run directory's lock while they run
    (``run_dir_lock``): a second one on the same run_dir is refused before it starts. The
    ranks of ``--np N`` take none (their launcher holds it), nor does ``--elastic`` (every
    host runs the command)."""
    if args.verb not in ("train", "tune") or _in_rank() or getattr(args, "elastic", False):
        return contextlib.nullcontext()
    from gmeta_tf.config import load_config
    from gmeta_tf.run_dir_lock import run_dir_held

    config = load_config(args.config or "default", list(args.overrides)) \
        if args.verb == "tune" else _config(args)
    return run_dir_held(config.run_dir, f"gmeta {args.verb}")


def _bad_input(err: Exception | str) -> int:
    print(f"gmeta: error: {err}", file=sys.stderr)
    _record_status(2, str(err))
    return 2


def _record_status(status: int, message: str) -> None:
    from gmeta_tf.launcher import record_status

    record_status(status, message)


class _NeverRaised(Exception):
    """Matches no error: what ``_checkpoint_error`` gives before checkpoints were read."""


def _checkpoint_error() -> type:
    """CheckpointError; where its module (which imports TensorFlow) was never imported, none
    can have been raised, so a class nothing raises (``gmeta data`` stays TensorFlow-free)."""
    module = sys.modules.get("gmeta_tf.checkpoint")
    return module.CheckpointError if module is not None else _NeverRaised


if __name__ == "__main__":
    sys.exit(main())
