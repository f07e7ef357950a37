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
from gmeta_tf.data.converters.pipeline import DEFAULT_MIN_BLOCKS, MAX_AUTO_ROWS_PER_BLOCK
from gmeta_tf.config_fields import FieldError
from gmeta_tf.data.errors import DataError
from gmeta_tf.data.file_check import check_data_file
from gmeta_tf.data.manifest import Manifest
from gmeta_tf.data.split import SplitConfig, source_split


def _csv_list(text: str) -> list[str]:
    return [s for s in text.split(",") if s]


def _add_common(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("output")
    out.add_argument("out_dir", help="dataset directory to write (refused if it exists, "
                                     "unless --overwrite)")
    out.add_argument("--format", dest="file_format", choices=["parquet", "orc"],
                     default="parquet", help="data file format (default parquet)")
    out.add_argument("--rows-per-block", type=int, default=None,
                     help="rows per block, the unit ranks share out (whole tasks; a block "
                          "ends at the first task end past this many rows). Default: chosen "
                          f"from the row count so each split has at least {DEFAULT_MIN_BLOCKS} "
                          f"blocks when it has that many tasks (at most "
                          f"{MAX_AUTO_ROWS_PER_BLOCK})")
    out.add_argument("--rows-per-file", type=int, default=OutputConfig.rows_per_file,
                     help="rows per data file; a file ends at a block end, and blocks are cut "
                          "at most this long (default %(default)s)")
    out.add_argument("--bucket-bytes", type=int, default=OutputConfig.bucket_bytes,
                     help="input bytes per on-disk task bucket while converting: bounds the "
                          "converter's memory, not the output (default %(default)s)")
    out.add_argument("--bad-rows", choices=["error", "skip"], default="error",
                     help="error (default): stop at the first malformed line, value that is not "
                          "a number, empty task value or NaN/out-of-range label, naming the "
                          "file, line and column; skip: drop such rows, count them in the log "
                          "and the manifest")
    out.add_argument("--overwrite", action="store_true",
                     help="replace an existing dataset at out_dir (only once the new one is "
                          "complete and has rows; the log compares the two)")
    split = p.add_argument_group("cold-start split (README: Your own data, protocol)")
    split.add_argument("--seed", type=int, default=0, help="seed of every split decision")
    split.add_argument("--warm-fraction", type=float,
                       help="fraction of tasks that are warm (trained on); the rest are cold "
                            "(held out for evaluation). Default 0.8")
    split.add_argument("--valid-fraction", type=float,
                       help="fraction of the warm tasks held out as the 'valid' split "
                            "(validation: early stopping, checkpoint choice, tuning; default "
                            "0.1)")
    split.add_argument("--query-size", type=int,
                       help="query rows per task (scored); the task's other rows are its "
                            "support rows (adapted on); 0 for row data read whole by a plain "
                            "CTR model. Default 10 (criteo 4, synthetic 5)")
    split.add_argument("--min-rows", type=int,
                       help="drop tasks with fewer rows (at least query-size + 1). Default 13 "
                            "(criteo and synthetic 8)")
    split.add_argument("--max-rows", type=int,
                       help="drop scored tasks (valid, cold) with more rows (default: none); "
                            "longer warm tasks are trained on unless --no-train-long-tasks")
    split.add_argument("--train-long-tasks", action=argparse.BooleanOptionalAction,
                       help="keep warm tasks longer than --max-rows for training, their rows "
                            "drawn anew each epoch, those drawn for validation too "
                            "(default); --no-train-long-tasks drops "
                            "every long task (MeLU's protocol to the letter)")
    split.add_argument("--query-selection", choices=["random", "last"],
                       help="query rows at random (default) or a task's last rows by the "
                            "order column (order_by / --order-by)")


def _add_csv(csv: argparse.ArgumentParser) -> None:
    csv.add_argument("src", nargs="+", help="CSV file(s) with the same columns")
    m = csv.add_argument_group("column mapping (a --mapping file, or these flags, which "
                               "override it)")
    m.add_argument("--mapping", help="YAML mapping file: every key of the flags below, plus "
                                     "join (side files) and header/columns")
    m.add_argument("--task", help="column whose value is the task (user, ad, site, ...); "
                                  "none: every row is its own task")
    m.add_argument("--label", help="label column (a number)")
    m.add_argument("--label-threshold", type=float,
                   help="label = 1 if value >= this else 0 (the raw value is kept as a second "
                        "label named after the column)")
    m.add_argument("--label-range", type=float, nargs=2, metavar=("LOW", "HIGH"),
                   help="valid raw label values; others are bad rows")
    m.add_argument("--sparse", type=_csv_list, metavar="COL,...",
                   help="categorical columns -> int64 ids (integers keep their value, other "
                        "text is hashed per column; empty -> 0)")
    m.add_argument("--multi-hot", type=_csv_list, metavar="COL:WIDTH,...",
                   help="multi-valued columns ('a|b|c') -> up to WIDTH ids per row")
    m.add_argument("--dense", type=_csv_list, metavar="COL,...",
                   help="numeric feature columns (missing -> 0.0, counted)")
    m.add_argument("--order-by", metavar="COL",
                   help="time column (numbers or ISO date-times): rows of a task are kept in "
                        "this order, and --query-selection last takes the latest")
    m.add_argument("--separator", help="separator of the values in a multi-hot cell "
                                       "(default '|')")
    m.add_argument("--delimiter", help="field delimiter of the file (default ','; 'tab' or "
                                       "'\\t' for a TSV file; several characters too, "
                                       "e.g. '::')")
    m.add_argument("--encoding", help="character encoding of the file (default utf-8; e.g. "
                                      "latin-1)")
    names = m.add_mutually_exclusive_group()
    names.add_argument("--no-header", dest="columns", type=_csv_list, metavar="COL,...",
                       help="the file has no header line: these are its column names")
    names.add_argument("--rename", type=_csv_list, metavar="COL,...",
                       help="names for the file's columns, one for each in its order, read in "
                            "place of its header line's (e.g. userId,movieId,rating,timestamp "
                            "read as user_id,item_id,rating,timestamp)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gmeta-data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ml = sub.add_parser("movielens", help="MovieLens 100K directory")
    ml.add_argument("src_dir", help="the ml-100k directory (u.data, u.user, u.item, ...)")
    criteo = sub.add_parser("criteo", help="raw Criteo TSV file(s)")
    criteo.add_argument("src", nargs="+", help="Criteo TSV file(s): label, I1..I13, C1..C26")
    criteo.add_argument("--int-mode", choices=["log", "bucketize"], default="log",
                        help="I1..I13 as log(1+x) dense features, or bucketized sparse ids")
    criteo.add_argument("--task-column", default="C2", help="categorical column whose value "
                                                           "is the task (default C2)")
    csv = sub.add_parser("csv", help="any CSV with a column mapping",
                         description="Converts CSV file(s) to a task-partitioned dataset. "
                                     "README section 'Your own data' has the mapping format "
                                     "and worked examples.")
    _add_csv(csv)
    syn = sub.add_parser("synthetic", help="synthetic users with their own tastes")
    syn.add_argument("--tasks", type=int, default=10_000, help="users (default %(default)s)")
    syn.add_argument("--rows-per-task", type=int, default=20,
                     help="rows per user (default %(default)s)")
    for p in (ml, criteo, csv, syn):
        _add_common(p)
    info = sub.add_parser("info", help="print a dataset's summary after verifying every file "
                                       "(size, SHA-256, schema); exit 2 when one is damaged")
    info.add_argument("path", help="dataset directory")
    info.add_argument("--no-verify", action="store_true",
                      help="print the manifest's summary without reading the data files")
    return parser


def _split(args: argparse.Namespace, defaults: SplitConfig) -> SplitConfig:
    fields = ("warm_fraction", "valid_fraction", "query_size", "min_rows", "max_rows",
              "query_selection", "train_long_tasks")
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
             "separator": args.separator, "delimiter": args.delimiter, "encoding": args.encoding,
             "label_threshold": args.label_threshold, "label_range": args.label_range,
             "sparse": args.sparse, "multi_hot": args.multi_hot, "dense": args.dense,
             "columns": args.columns or args.rename}
    d.update({k: v for k, v in flags.items() if v is not None})
    if args.columns:
        d["header"] = False
    elif args.rename:
        d["header"] = True
    if "label" not in d:
        raise DataError("csv needs --label (or a --mapping file with it); --task too unless "
                        "every row is its own task (a plain CTR model's rows)")
    return CsvMapping.from_dict(d)


def _run(args: argparse.Namespace) -> Manifest:
    if args.command == "movielens":
        return convert_movielens(args.src_dir, args.out_dir, split=_split(args, source_split("movielens")),
                                 output=_output(args))
    if args.command == "criteo":
        return convert_criteo(args.src, args.out_dir, int_mode=args.int_mode,
                              task_column=args.task_column,
                              split=_split(args, source_split("criteo")),
                              output=_output(args))
    if args.command == "csv":
        return convert_csv(args.src, args.out_dir, _mapping(args), split=_split(args, source_split("csv")),
                           output=_output(args))
    from gmeta_tf.data import synthetic

    return synthetic.generate(args.out_dir, args.tasks, args.rows_per_task, args.seed,
                              split=_split(args, source_split("synthetic")), output=_output(args))


def _info(args: argparse.Namespace) -> Manifest:
    manifest = Manifest.load(args.path)
    if not args.no_verify:
        for entry in manifest.files:
            check_data_file(args.path, entry, manifest, checksum=True)
    return manifest


def summary(manifest: Manifest) -> dict:
    """Counts per split, for ``info`` and for the line printed after a conversion."""
    splits = {split: {k: c[k] for k in ("files", "rows", "tasks")}
              for split, c in manifest.per_split().items()}
    return {"file_format": manifest.file_format, "features": manifest.schema.to_list(),
            "split": manifest.split, "splits": splits}


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit code (2 for bad input)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    try:
        manifest = _info(args) if args.command == "info" else _run(args)
    except (DataError, FieldError) as e:
        print(f"gmeta-data: error: {e}", file=sys.stderr)
        return 2
    out = summary(manifest)
    if args.command == "info":
        out["verified"] = "size and sha256 of every file" if not args.no_verify else "no"
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
