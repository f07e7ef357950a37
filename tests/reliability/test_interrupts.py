"""Ctrl-C and SIGTERM inside a loop (``gmeta_tf.interrupts``): the first is raised between
steps, never inside TensorFlow's C++, and an error that an interrupt became is reported as
the interrupt."""

from __future__ import annotations

import signal

import pytest

from gmeta_tf import cli, interrupts


def _deliver(signum: int) -> None:
    """Sends ``signum`` to this process and runs Python bytecode until it is handled."""
    signal.raise_signal(signum)
    for _ in range(1000):
        pass


def test_a_first_signal_in_a_loop_is_raised_at_its_next_check_and_a_second_at_once():
    taken = []
    with interrupts.handled():
        with pytest.raises(KeyboardInterrupt):
            with interrupts.deferred():
                for step in interrupts.checked(range(5)):
                    taken.append(step)
                    if step == 1:
                        _deliver(signal.SIGINT)  # recorded: the step goes on
                        taken.append("after")
        assert taken == [0, 1, "after"]
        assert interrupts.received() is KeyboardInterrupt

        with pytest.raises(interrupts.Terminated):  # a loop that never checks: the second
            with interrupts.deferred():
                _deliver(signal.SIGTERM)
                taken.append("recorded")
                _deliver(signal.SIGTERM)
                taken.append("never")
        assert taken[-1] == "recorded"
        assert interrupts.received() is interrupts.Terminated


def test_a_region_that_ends_raises_its_signal_and_outside_one_a_signal_is_raised_at_once():
    with interrupts.handled():
        with pytest.raises(KeyboardInterrupt):
            with interrupts.deferred():
                _deliver(signal.SIGINT)
        interrupts.check()  # raised once: nothing is left pending
        with pytest.raises(interrupts.Terminated):
            _deliver(signal.SIGTERM)
        # an error ending the region drops the recorded signal (it stays received)
        with pytest.raises(ValueError):
            with interrupts.deferred():
                _deliver(signal.SIGINT)
                raise ValueError("the loop's own error")
        interrupts.check()
        assert interrupts.received() is KeyboardInterrupt
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with interrupts.handled():  # a new outermost region starts with no record
        assert interrupts.received() is None


def test_a_held_region_keeps_a_first_signal_for_its_owner_and_a_second_is_raised():
    """Inside ``held()`` the loops nested there (a validation pass) raise nothing: the
    signal stays pending until the training loop, stopped where its ranks agree, raises
    it; a rank that received none raises ``PeerStopped``; a second signal is not held."""
    with interrupts.handled():
        with pytest.raises(interrupts.Terminated) as raised:
            with interrupts.deferred(), interrupts.held():
                assert interrupts.pending() is None
                _deliver(signal.SIGTERM)
                with interrupts.deferred():  # a nested scoring loop runs to its end
                    assert list(interrupts.checked(range(3))) == [0, 1, 2]
                interrupts.check()
                assert interrupts.pending() is interrupts.Terminated
                interrupts.raise_pending()
        assert raised.type is interrupts.Terminated and interrupts.pending() is None

        with pytest.raises(interrupts.PeerStopped):  # stopped because another rank was
            with interrupts.deferred(), interrupts.held():
                interrupts.raise_pending()

        taken = []
        with pytest.raises(KeyboardInterrupt):
            with interrupts.deferred(), interrupts.held():
                _deliver(signal.SIGINT)
                taken.append("held")
                _deliver(signal.SIGINT)
                taken.append("never")
        assert taken == ["held"]


def test_a_rank_stopped_with_another_says_so(monkeypatch, capsys):
    def stopped(args):
        with interrupts.deferred(), interrupts.held():
            interrupts.raise_pending()

    monkeypatch.setattr(cli, "run_config", stopped)
    assert cli.main(["config"]) == 143
    err = capsys.readouterr().err
    assert "gmeta: stopped with another rank, which was interrupted:" in err, err


def test_an_error_raised_after_ctrl_c_is_reported_as_the_interrupt(monkeypatch, capsys):
    """What TensorFlow made of a Ctrl-C that came inside an eager op (measured: once in 20
    Ctrl-Cs of a 1-rank ``gmeta train`` on a busy machine) ends ``gmeta`` as Ctrl-C does."""

    def interrupted_inside_tensorflow(args):
        with interrupts.deferred():
            _deliver(signal.SIGINT)
            raise TypeError("Expected `context` argument in EagerTensor constructor to have "
                            "a `_handle` attribute but it did not.")

    monkeypatch.setattr(cli, "run_config", interrupted_inside_tensorflow)
    assert cli.main(["config"]) == 130
    err = capsys.readouterr().err
    assert "gmeta: interrupted:" in err and "Traceback" not in err, err

    def failing(args):
        raise TypeError("a genuine bug")

    monkeypatch.setattr(cli, "run_config", failing)  # no signal: the error is the error
    with pytest.raises(TypeError, match="a genuine bug"):
        cli.main(["config"])


def test_each_interrupt_names_its_signal_and_a_shells_status():
    assert [(interrupts.signal_of(e), interrupts.name_of(e), interrupts.exit_status(e))
            for e in (KeyboardInterrupt, interrupts.Terminated, interrupts.PeerStopped)] == [
        (signal.SIGINT, "Ctrl-C", 130), (signal.SIGTERM, "SIGTERM", 143),
        (signal.SIGTERM, "SIGTERM", 143)]
