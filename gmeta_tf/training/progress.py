"""A training progress bar for rank 0: step, samples/s and loss.

On a terminal it redraws one line; otherwise (a log file, horovodrun's piped output) it
prints one line per update, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 24


class ProgressBar:
    """``[=======>.....] step 120/500  1,840 samples/s  loss 0.6421``.

    Args:
        total: Steps of the run.
        initial: Step the run starts from (after ``--resume``).
        enabled: False draws nothing (ranks other than 0).
        stream: Where to draw (default stderr).
    """

    def __init__(self, total: int, initial: int = 0, enabled: bool = True,
                 stream: TextIO | None = None) -> None:
        self.total, self.step, self.enabled = total, initial, enabled
        self.stream = stream or sys.stderr
        self.dynamic = enabled and self.stream.isatty()
        self._start = time.perf_counter()

    def line(self, step: int, samples_per_sec: float, metrics: dict[str, float]) -> str:
        done = int(_WIDTH * step / max(self.total, 1))
        bar = "=" * max(done - 1, 0) + (">" if done else "") + "." * (_WIDTH - done)
        text = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        elapsed = time.perf_counter() - self._start
        return (f"[{bar}] step {step}/{self.total}  {samples_per_sec:,.0f} samples/s  {text}  "
                f"({elapsed:.0f}s)")

    def update(self, step: int, samples_per_sec: float, metrics: dict[str, float]) -> None:
        """Draws the bar at ``step``."""
        self.step = step
        if not self.enabled:
            return
        text = self.line(step, samples_per_sec, metrics)
        if self.dynamic:
            self.stream.write("\r" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.dynamic:
            self.stream.write("\n")
            self.stream.flush()
