"""Ctrl-C (SIGINT) and SIGTERM, raised where a loop can stop.

Python raises ``KeyboardInterrupt`` wherever the main thread is when the signal comes. In a
training or scoring loop that is mostly inside TensorFlow, whose C++ calls back into Python
(an eager op converting its arguments, a tf.data iterator running its generator): an
exception raised there can come out as another one (``TypeError: Expected `context`
argument in EagerTensor constructor to have a `_handle` attribute``, once in 20 Ctrl-Cs of a
1-rank ``gmeta train`` on a busy machine) or be lost, the run training on.

So ``gmeta`` handles both signals here (``handled``). Inside ``deferred()`` (the training
loop, the scoring loops) the first signal is recorded and raised by the loop's next
``check()``, between steps or batches, or when the region ends; a second one is raised at
once, for a loop stuck where it never checks. Outside those regions a signal is raised at
once, as Python does. An error raised after a signal came is the signal's doing:
``received()`` tells ``gmeta`` to report it as the interrupt.

Example::

    with interrupts.deferred():
        for batch in interrupts.checked(batches):
            train_step(batch)
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``docker stop``, a scheduler's pre-emption), raised where the
    process is as Ctrl-C's ``KeyboardInterrupt`` is, so the same clean-up runs: the
    launcher stops the ranks, a ``--fresh`` run puts back what it set aside, and ``gmeta``
    prints one line saying what is kept (status 143)."""


class PeerStopped(Terminated):
    """Raised on a rank that received no signal when another rank did: the ranks of a
    training run stop together, after the step where any of them had one
    (``training.stop_vote``), so no rank is left waiting in a collective."""


_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_handled_depth = 0
_deferred_depth = 0
_held_depth = 0
_pending: type[KeyboardInterrupt] | None = None  # recorded in a deferred region, not raised
_received: type[KeyboardInterrupt] | None = None  # the last signal that came


def _exception(signum: int) -> type[KeyboardInterrupt]:
    return Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def signal_of(exception: type[KeyboardInterrupt]) -> signal.Signals:
    """The signal an interrupt stands for: SIGTERM for ``Terminated`` (and
    ``PeerStopped``), else SIGINT."""
    return signal.SIGTERM if issubclass(exception, Terminated) else signal.SIGINT


def name_of(exception: type[KeyboardInterrupt]) -> str:
    """How a log line names it: "Ctrl-C" or "SIGTERM"."""
    return "SIGTERM" if signal_of(exception) == signal.SIGTERM else "Ctrl-C"


def exit_status(exception: type[KeyboardInterrupt]) -> int:
    """A shell's status for a process the interrupt stopped: 130 (Ctrl-C) or 143."""
    return 128 + signal_of(exception)


def _handler(signum: int, frame) -> None:
    global _pending, _received
    exception = _exception(signum)
    _received = exception
    if _deferred_depth and _pending is None:
        _pending = exception  # the loop raises it at its next check
        return
    _pending = None
    raise exception()


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGINT and SIGTERM handled as the module says while inside (on the main thread; a
    no-op elsewhere, where Python delivers no signal). Nested uses share the outer one's
    record; the outermost clears it on entry and puts the previous handlers back on exit."""
    global _handled_depth, _pending, _received
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _handled_depth == 0:
        _pending = _received = None
    previous = {s: signal.signal(s, _handler) for s in _SIGNALS}
    _handled_depth += 1
    try:
        yield
    finally:
        _handled_depth -= 1
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside, a first signal is raised by ``check()`` (or when the region ends), not
    where the main thread is."""
    global _deferred_depth, _pending
    _deferred_depth += 1
    try:
        yield
    except BaseException:
        if _deferred_depth == 1:  # the error ends the loop; the signal is received()
            _pending = None
        raise
    finally:
        _deferred_depth -= 1
    if _deferred_depth == 0:
        check()


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Inside (and inside ``deferred()``), ``check()`` raises nothing, in the loops nested
    there too (a validation pass): a first signal stays recorded (``pending()``) until the
    loop that owns the region stops where all its ranks agree and raises it
    (``raise_pending()``). A second signal is still raised at once."""
    global _held_depth
    _held_depth += 1
    try:
        yield
    finally:
        _held_depth -= 1


def check() -> None:
    """Raises the signal a deferred region recorded, if one came (a no-op otherwise, and
    inside ``held()``)."""
    if not _held_depth:
        _raise_recorded()


def _raise_recorded() -> None:
    global _pending
    if _pending is not None and threading.current_thread() is threading.main_thread():
        exception, _pending = _pending, None
        raise exception()


def pending() -> type[KeyboardInterrupt] | None:
    """The signal a deferred region recorded and nothing has raised yet, else None."""
    return _pending


def raise_pending() -> None:
    """Raises the recorded signal, held or not; ``PeerStopped`` if none came to this
    process (it stops because another rank received one)."""
    _raise_recorded()
    raise PeerStopped()


def checked(items: Iterable[T]) -> Iterator[T]:
    """``items``, with ``check()`` before each is taken (a loop that stops between items)."""
    for item in items:
        check()
        yield item
    check()


def received() -> type[KeyboardInterrupt] | None:
    """``KeyboardInterrupt`` or ``Terminated`` when a signal came since the outermost
    ``handled()`` began, else None."""
    return _received
