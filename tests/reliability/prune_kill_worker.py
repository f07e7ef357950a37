"""``gmeta train`` that SIGKILLs itself in the middle of its first checkpoint pruning.

    python -m tests.reliability.prune_kill_worker train --config ... (gmeta's arguments)

The first time anything deletes a ``ckpt-<step>`` directory tree (under whatever name the
pruning gave it), every file of that tree but its manifest is deleted, then the process
kills itself with SIGKILL: the worst moment for a plain ``rmtree`` of the checkpoint (what
is left still has its manifest, so it looks complete), and no clean-up handler runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

from gmeta_tf import checkpoint
from gmeta_tf.cli import main

KILLED_WHILE_DELETING = "prune_kill_worker: killing myself while deleting"


def _dying_rmtree(path, *args, **kwargs) -> None:
    tree = Path(path)
    if "ckpt-" in tree.name:
        for file in sorted(p for p in tree.rglob("*") if p.is_file()):
            if file.name != checkpoint.MANIFEST:
                file.unlink()
        print(f"{KILLED_WHILE_DELETING} {tree}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    _rmtree(path, *args, **kwargs)


_rmtree = shutil.rmtree

if __name__ == "__main__":
    shutil.rmtree = _dying_rmtree
    sys.exit(main(sys.argv[1:]))
