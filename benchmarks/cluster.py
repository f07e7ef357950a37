"""Distributed benchmarks over real network hops: 2 hosts x 1 rank of a cluster on one
machine (gmeta_tf.local_cluster), at an unshaped link, 10 Gbit/s and 1 Gbit/s.

    python -m benchmarks.cluster [--repeats 5] [--rates unshaped,10gbit,1gbit] [--quick]

As root (network namespaces, sshd). Brings a 2-host cluster up, and at each rate (a tc
token bucket on every host's link, both ways) runs under ``horovodrun -np 2 -H
hostA:1,hostB:1 --network-interface eth0`` from host A:

- ``hybrid``: ``benchmarks.hybrid --only speed``: synchronous vs hybrid s = 0, 1, 2, 4 on
  the Zipf batch, every contender traced before its timed window, paired over repeats;
- ``meta_step``: ``benchmarks.meta_step --paired``: the G-Meta step vs the per-task
  pipeline (one compiled call per task) vs the per-task loop traced into ONE tf.function
  (T tasks unrolled, each lookup and push its own exchange), k = 5;
- ``sharded_step``: ``benchmarks.sharded_step --vsi-vs-raw``: samples/s with Virtual
  Sparse Id (deduplicated ids on the wire) vs raw ids (every occurrence on the wire).

The meta step is also run as one plain process on host A (1 rank, no exchange) for
reference. Every contender of a comparison runs in the same job, so the ratios are paired
within one run; each job prints its own JSON, and this prints one JSON line last with, per
rate, ``hybrid_s2_vs_sync``, ``gmeta_vs_per_task_graph`` and ``vsi_vs_raw`` (medians of
within-repeat ratios) and the figures behind them. The cluster is taken down at the end,
also on failure or Ctrl-C.

A namespace shares the machine's kernel and cores: the links have a rate, not a latency
(no netem here), and both hosts' ranks share the same 2 cores, so compute does not scale
with hosts as it would on two machines.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.arguments import comma_separated, joined
from gmeta_tf.local_cluster import INTERFACE, ClusterError, LocalCluster, rate_bits

ROOT = Path(__file__).resolve().parents[1]
HOROVODRUN = Path(sys.executable).with_name("horovodrun")
RATES = ("unshaped", "10gbit", "1gbit")


def log(msg: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def last_json(output: str) -> dict:
    for line in reversed(output.strip().splitlines()):
        start = line.find("{")
        if start >= 0:
            try:
                return json.loads(line[start:])
            except json.JSONDecodeError:
                continue
    raise RuntimeError(f"no JSON line in the output:\n{output[-3000:]}")


def run(command: list[str], log_path: Path, timeout: float) -> dict:
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    with open(log_path, "w") as out:
        proc = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout)
    output = log_path.read_text(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{output[-3000:]}")
    return last_json(output)


def benchmarks(args) -> dict[str, list[str]]:
    r = str(args.repeats)
    return {
        "hybrid": ["-m", "benchmarks.hybrid", "--only", "speed", "--repeats", r,
                   "--batch-size", str(args.hybrid_batch), "--timed-batches",
                   str(args.hybrid_timed_batches), "--hidden", joined(args.hybrid_hidden)],
        "meta_step": ["-m", "benchmarks.meta_step", "--paired", r, "--tasks", str(args.tasks),
                      "--steps", str(args.meta_steps)],
        "sharded_step": ["-m", "benchmarks.sharded_step", "--vsi-vs-raw", r, "--batch-size",
                         str(args.sharded_batch), "--steps", str(args.sharded_steps)],
    }


def summary(name: str, report: dict) -> dict:
    """The figures of one job that the final line carries."""
    if name == "hybrid":
        keys = [k for k in report if k.startswith(("samples_per_s_", "ratio_paired_",
                                                   "window_share_"))]
        out = {k: report[k] for k in keys}
        out["hybrid_s2_vs_sync"] = report["ratio_paired_hybrid_s2_vs_sync"]
        out["hidden_units"] = report.get("hidden_units")
        return out
    if name == "meta_step":
        return {k: v for k, v in report.items() if k.startswith(("tasks_per_s", "gmeta_vs",
                                                                 "per_task_graph_vs"))}
    return {k: v for k, v in report.items() if k.startswith(("samples_per_s", "vsi_vs"))}


def link_rates(text: str) -> list[str]:
    """``--rates``: "unshaped" and/or tc rates (``1gbit``), each checked as it is parsed, so a
    bad one stops the benchmark before a cluster is brought up."""
    rates = comma_separated()(text)
    for rate in rates:
        if rate != "unshaped":
            try:
                rate_bits(rate)
            except ClusterError as e:
                expected = str(e).split("expected ", 1)[-1]
                raise argparse.ArgumentTypeError(f"{rate!r} is not a rate: expected 'unshaped' "
                                                 f"or {expected}") from None
    return rates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="paired repeats (>= 5 for "
                        "the figures; default %(default)s)")
    parser.add_argument("--rates", default=",".join(RATES), type=link_rates,
                        help="comma-separated: unshaped and/or tc rates (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help="small batches, 1 repeat")
    parser.add_argument("--only", choices=("hybrid", "meta_step", "sharded_step"),
                        action="append", help="run only these (repeatable)")
    parser.add_argument("--hybrid-batch", type=int, default=65536)
    parser.add_argument("--hybrid-timed-batches", type=int, default=5,
                        help="batches in each hybrid contender's timed window per repeat "
                             "(default %(default)s)")
    parser.add_argument("--hybrid-hidden", default="64", type=comma_separated(int, minimum=1),
                        help="the hybrid benchmark tower's hidden widths, comma-separated "
                             "(default %(default)s)")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--meta-steps", type=int, default=4)
    parser.add_argument("--sharded-batch", type=int, default=65536)
    parser.add_argument("--sharded-steps", type=int, default=4)
    parser.add_argument("--cluster-name", default="gmbench",
                        help="prefix of the cluster's namespaces (default %(default)s)")
    parser.add_argument("--logs", type=Path, default=None,
                        help="folder for every job's full output (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.hybrid_batch, args.tasks = 1, 8192, 8
        args.meta_steps, args.sharded_batch, args.sharded_steps = 2, 8192, 2
    rates = args.rates
    missing = LocalCluster.missing_requirements(rate="1gbit")
    if missing:
        print(f"benchmarks.cluster: cannot run, missing: {'; '.join(missing)}", file=sys.stderr)
        return 2
    logs = args.logs or Path(tempfile.mkdtemp(prefix="gmeta-cluster-bench-"))
    logs.mkdir(parents=True, exist_ok=True)
    jobs = {k: v for k, v in benchmarks(args).items() if not args.only or k in args.only}
    cluster = LocalCluster(name=args.cluster_name, state_dir=logs / "cluster")
    report = {"benchmark": "cluster", "hosts": 2, "ranks_per_host": 1,
              "repeats": args.repeats, "quick": args.quick, "logs": str(logs), "rates": {}}
    began = time.perf_counter()
    # SIGTERM ends the run like Ctrl-C does: through the finally below (cluster down).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        hosts = cluster.up(2)
        launch = [str(HOROVODRUN), "-np", "2", "-H", ",".join(f"{h.address}:1" for h in hosts),
                  "--network-interface", INTERFACE, "--ssh-identity-file",
                  str(cluster.identity_file), "--gloo-timeout-seconds", "120"]
        for rate in rates:
            for host in hosts:
                cluster.set_rate(host, None if rate == "unshaped" else rate)
            figures = {}
            for name, job in jobs.items():
                log(f"{name} at {rate}")
                out = run(cluster.command_in(hosts[0], [*launch, sys.executable, *job]),
                          logs / f"{name}.{rate}.log", timeout=3600)
                figures[name] = summary(name, out)
                log(f"{name} at {rate}: {json.dumps(figures[name])}")
            row = {}
            if "hybrid" in figures:
                row["hybrid_s2_vs_sync"] = figures["hybrid"]["hybrid_s2_vs_sync"]
            if "meta_step" in figures:
                row["gmeta_vs_per_task_graph"] = figures["meta_step"]["gmeta_vs_per_task_graph"]
                row["gmeta_vs_per_task"] = figures["meta_step"]["gmeta_vs_per_task"]
            if "sharded_step" in figures:
                row["vsi_vs_raw"] = figures["sharded_step"]["vsi_vs_raw"]
            report["rates"][rate] = {**row, **figures}
        if "meta_step" in jobs:
            log("meta_step on 1 rank (host 1, plain process)")
            one = run(cluster.command_in(hosts[0], [sys.executable, *jobs["meta_step"]]),
                      logs / "meta_step.1rank.log", timeout=3600)
            report["one_rank"] = {"meta_step": summary("meta_step", one)}
    finally:
        cluster.down()
        left = cluster.leftovers()
        if left:
            log(f"WARNING: left behind: {left}")
    flat = report["rates"]
    slow = flat.get("1gbit", {})
    report["meets_target"] = {
        "hybrid_s2_1.2x_sync_at_1gbit": (slow["hybrid_s2_vs_sync"] >= 1.2
                                         if "hybrid_s2_vs_sync" in slow else None),
        "gmeta_faster_than_per_task_graph_at_1gbit": (
            slow["gmeta_vs_per_task_graph"] > 1 if "gmeta_vs_per_task_graph" in slow else None),
        "gmeta_ratio_grows_as_link_slows": (
            flat["1gbit"]["gmeta_vs_per_task_graph"] > flat["unshaped"]["gmeta_vs_per_task_graph"]
            if all("gmeta_vs_per_task_graph" in flat.get(r, {}) for r in ("1gbit", "unshaped"))
            else None),
        "vsi_faster_than_raw_at_1gbit": (slow["vsi_vs_raw"] > 1 if "vsi_vs_raw" in slow
                                         else None),
    }
    report["minutes"] = round((time.perf_counter() - began) / 60, 1)
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
