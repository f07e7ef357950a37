"""Logging with rank prefixes: every line says which rank of how many wrote it."""

from __future__ import annotations

import logging
import sys

_FORMAT = "[rank {rank}/{size}] %(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: int = logging.INFO, single_process: bool = False) -> None:
    """Sends log records to stderr as ``[rank r/n] time LEVEL logger: message``.

    Rank 0 logs at ``level``; the other ranks log warnings and errors only, so a
    multi-rank run stays readable. ``single_process``: a command that never runs under
    ``horovodrun`` (``gmeta data``) logs as rank 0 of 1 without asking Horovod, which
    would import TensorFlow (seconds, and its start-up lines) for a NumPy and Arrow job.
    """
    if single_process:
        rank, size = 0, 1
    else:
        from gmeta_tf import distributed

        rank, size = distributed.rank(), distributed.size()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT.format(rank=rank, size=size),
                                           datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if rank == 0 else max(level, logging.WARNING))
    for noisy in ("absl", "tensorflow"):  # SavedModel and checkpoint chatter
        logging.getLogger(noisy).setLevel(logging.WARNING)
