"""``gmeta-data``: convert raw data to task-partitioned datasets, and inspect them.

Examples::

    gmeta-data movielens ../shared/data/ml-100k out/ml --seed 0
    gmeta-data criteo ../shared/data/criteo/train.tsv out/criteo --format orc --int-mode log
    gmeta-data csv ratings.csv out/r --mapping mapping.yaml
    gmeta-data csv ratings.csv out/r --task user --label rating --label-threshold 4 \\
        --sparse user,item --multi-hot genres:6 --dense age --order-by ts
    gmeta-data synthetic out/syn --tasks 100000 --rows-per-task 20
    gmeta-data info out/ml

Split and output options are the fields of ``SplitConfig`` and ``OutputConfig``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys

from gmeta_tf.data.converters import (CsvMapping, OutputConfig, convert_criteo, convert_csv,
                                      convert_movielens)
from gmeta_tf.data.errors import DataError
from gmeta_tf.data.manifest import Manifest
from gmeta_tf.data.split import SplitConfig


def _csv_list(text: str) -> list[str]:
    return [s for s in text.split(",") if s]


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0, help="split seed")
    p.add_argument("--warm-fraction", type=float, help="fraction of warm tasks")
    p.add_argument("--valid-fraction", type=float,
                   help="fraction of the warm tasks held out as the 'valid' split (validation: "
                        "early stopping, checkpoint choice, tuning; default 0.1)")
    p.add_argument("--query-size", type=int, help="query rows per task")
    p.add_argument("--min-rows", type=int, help="drop tasks with fewer rows")
    p.add_argument("--max-rows", type=int, help="drop tasks with more rows")
    p.add_argument("--query-selection", choices=["random", "last"])
    p.add_argument("--format", dest="file_format", choices=["parquet", "orc"], default="parquet")
    p.add_argument("--rows-per-file", type=int, default=OutputConfig.rows_per_file)
    p.add_argument("--rows-per-block", type=int, default=OutputConfig.rows_per_block)
    p.add_argument("--bucket-bytes", type=int, default=OutputConfig.bucket_bytes)
    p.add_argument("--bad-rows", choices=["error", "skip"], default="error")
    p.add_argument("--overwrite", action="store_true")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gmeta-data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ml = sub.add_parser("movielens", help="MovieLens 100K directory")
    ml.add_argument("src_dir")
    criteo = sub.add_parser("criteo", help="raw Criteo TSV file(s)")
    criteo.add_argument("src", nargs="+")
    criteo.add_argument("--int-mode", choices=["log", "bucketize"], default="log")
    criteo.add_argument("--task-column", default="C2")
    csv = sub.add_parser("csv", help="any CSV with a column mapping")
    csv.add_argument("src", nargs="+")
    csv.add_argument("--mapping", help="YAML mapping file (flags below override it)")
    for flag in ("task", "label", "order-by", "separator", "delimiter"):
        csv.add_argument(f"--{flag}")
    csv.add_argument("--label-threshold", type=float)
    csv.add_argument("--label-range", type=float, nargs=2)
    csv.add_argument("--sparse", type=_csv_list)
    csv.add_argument("--multi-hot", type=_csv_list, help="NAME:WIDTH,...")
    csv.add_argument("--dense", type=_csv_list)
    csv.add_argument("--no-header", dest="columns", type=_csv_list, help="column names, comma-separated")
    syn = sub.add_parser("synthetic", help="synthetic users with their own tastes")
    syn.add_argument("--tasks", type=int, default=10_000)
    syn.add_argument("--rows-per-task", type=int, default=20)
    for p in (ml, criteo, csv, syn):
        _add_common(p)
    info = sub.add_parser("info", help="print a dataset's manifest summary")
    info.add_argument("path")
    return parser


def _split(args: argparse.Namespace, defaults: SplitConfig) -> SplitConfig:
    fields = ("warm_fraction", "valid_fraction", "query_size", "min_rows", "max_rows", "query_selection")
    given = {f: getattr(args, f) for f in fields if getattr(args, f) is not None}
    return dataclasses.replace(defaults, seed=args.seed, **given)


def _output(args: argparse.Namespace) -> OutputConfig:
    return OutputConfig(args.file_format, args.rows_per_file, args.rows_per_block,
                        args.bucket_bytes, args.overwrite, args.bad_rows)


def _mapping(args: argparse.Namespace) -> CsvMapping:
    d = {}
    if args.mapping:
        d = dataclasses.asdict(CsvMapping.from_yaml(args.mapping))
    flags = {"task": args.task, "label": args.label, "order_by": args.order_by,
             "separator": args.separator, "delimiter": args.delimiter,
             "label_threshold": args.label_threshold, "label_range": args.label_range,
             "sparse": args.sparse, "multi_hot": args.multi_hot, "dense": args.dense,
             "columns": args.columns}
    d.update({k: v for k, v in flags.items() if v is not None})
    if args.columns:
        d["header"] = False
    if "task" not in d or "label" not in d:
        raise DataError("csv needs --task and --label (or a --mapping file with them)")
    return CsvMapping.from_dict(d)


def _run(args: argparse.Namespace) -> Manifest:
    if args.command == "movielens":
        return convert_movielens(args.src_dir, args.out_dir, split=_split(args, SplitConfig()),
                                 output=_output(args))
    if args.command == "criteo":
        return convert_criteo(args.src, args.out_dir, int_mode=args.int_mode,
                              task_column=args.task_column,
                              split=_split(args, SplitConfig(query_size=4, min_rows=8)),
                              output=_output(args))
    if args.command == "csv":
        return convert_csv(args.src, args.out_dir, _mapping(args), split=_split(args, SplitConfig()),
                           output=_output(args))
    from gmeta_tf.data import synthetic

    return synthetic.generate(args.out_dir, args.tasks, args.rows_per_task, args.seed,
                              split=_split(args, synthetic.DEFAULT_SPLIT), output=_output(args))


def summary(manifest: Manifest) -> dict:
    """Counts per split, for ``info`` and for the line printed after a conversion."""
    out: dict = {"file_format": manifest.file_format, "features": manifest.schema.to_list(),
                 "split": manifest.split, "splits": {}}
    for f in manifest.files:
        s = out["splits"].setdefault(f.split, {"files": 0, "rows": 0, "tasks": 0})
        s["files"] += 1
        s["rows"] += f.rows
        s["tasks"] += f.tasks
    return out


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit code (2 for bad input)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        manifest = Manifest.load(args.path) if args.command == "info" else _run(args)
    except DataError as e:
        print(f"gmeta-data: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary(manifest)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
