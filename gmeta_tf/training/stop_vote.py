"""Every rank of a training run stops after the same step when a signal comes.

Ctrl-C or a scheduler's SIGTERM reaches the ranks at different moments, or only some of
them (one host pre-empted), and a rank that stopped on its own would leave the others
waiting in their next collective. So the ranks vote: an all-reduce of whether each has
a signal pending (``interrupts.pending()``), and all stop after a step where any had one.

A vote is a collective of its own (1.2 ms between two ranks of one host here), too dear
for every small step, so the ranks vote every k steps, k chosen so that votes come about
every ``every_seconds`` of training: rank 0 proposes the next k from the steps' pace
since the last vote, and the proposal travels in the vote itself, so every rank holds the
same k and votes at the same steps. A signal then stops the run within about
``every_seconds`` plus one step (``benchmarks/stop_vote.py`` measures the cost).
"""

from __future__ import annotations

import math
import time

import numpy as np

from gmeta_tf import distributed, interrupts

#: About how often the ranks vote, in seconds of training.
VOTE_EVERY_SECONDS = 0.25
#: The most steps between two votes.
MOST_STEPS = 64


class StopVote:
    """Call ``after_step()`` after every training step and ``now()`` where every rank is
    at the same point between steps; both return whether the ranks agreed to stop."""

    def __init__(self, every_seconds: float = VOTE_EVERY_SECONDS,
                 most_steps: int = MOST_STEPS) -> None:
        self.every_seconds, self.most_steps = every_seconds, most_steps
        self.size, self.rank = distributed.size(), distributed.rank()
        self._next = 1  # steps from the last vote to the next: the first after one step
        self._steps = 0
        self._since = time.monotonic()

    def after_step(self) -> bool:
        if self.size == 1:  # nobody to agree with: every step
            return interrupts.pending() is not None
        self._steps += 1
        return self.now() if self._steps >= self._next else False

    def now(self) -> bool:
        """Votes at once (a collective: every rank at the same step)."""
        pending = interrupts.pending() is not None
        if self.size == 1:
            return pending
        proposal = self._proposal() if self.rank == 0 else 0
        votes, next_steps = distributed.sum_over_ranks(np.array([int(pending), proposal]))
        self._next, self._steps, self._since = max(1, int(next_steps)), 0, time.monotonic()
        return bool(votes > 0)

    def _proposal(self) -> int:
        """Rank 0's k: the steps that take about ``every_seconds`` at the pace since the
        last vote (1 when no step was taken since)."""
        if not self._steps:
            return 1
        per_step = max(time.monotonic() - self._since, 1e-9) / self._steps
        return int(min(self.most_steps, max(1, math.floor(self.every_seconds / per_step))))
