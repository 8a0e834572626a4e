"""attach's Ctrl-C and SIGTERM handler while the script runs (issue 55, faults still open): the first
signal abandons the loaders' iterators (their `__del__` does nothing: no put into a queue whose lock
the signal may have left held, nothing printed from a `__del__`) and ends the script; where Python
swallows its exception (raised inside a `__del__` or an at-fork hook) the signal is handed on again;
a second signal writes every thread's stack first. `benchmarks/attach_signals.py` runs the
real command against signals to its process group."""

import signal
import sys
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from pipebench.attach import script_end
from pipebench.attach.script_end import (ScriptStop, abandon_iterators, hang_shows_itself, stop_workers,
                                         without_handler, workers_end_quietly)


class _Finalized:
    """Calls `inside` from its `__del__`, with the frame a signal handler would be given there."""

    def __init__(self, inside):
        self.inside = inside

    def __del__(self):
        self.inside(sys._getframe())


def test_the_first_signal_ends_the_script_and_a_second_dumps_every_threads_stack_first(capfd):
    stop = ScriptStop()
    with hang_shows_itself():
        with pytest.raises(KeyboardInterrupt) as first:
            stop(signal.SIGINT, sys._getframe())
        assert "every thread's stack" not in capfd.readouterr().err
        with pytest.raises(KeyboardInterrupt):  # SIGTERM's Terminated would stop this process's children
            stop(signal.SIGINT, sys._getframe())
    err = capfd.readouterr().err
    assert "signal SIGINT again; every thread's stack:" in err and "most recent call first" in err
    # The handler's own frame is left out of the traceback the script's user reads.
    frames = []
    tb = without_handler(first.value.__traceback__)
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert frames == ["test_the_first_signal_ends_the_script_and_a_second_dumps_every_threads_stack_first"]


def test_a_signal_python_swallows_in_a_finalizer_is_handed_on_again_and_nothing_is_printed(monkeypatch, capfd):
    """Raised inside a `__del__` (torch's shutdown of an epoch's workers) or an at-fork hook, the
    exception is printed as "Exception ignored" and swallowed, and the script would run on."""
    handed = []
    monkeypatch.setattr(script_end.threading, "Timer", lambda delay, call, args: SimpleNamespace(
        start=lambda: handed.append(args[0])))
    with hang_shows_itself(), workers_end_quietly() as stop:
        _Finalized(lambda frame: stop(signal.SIGINT, frame))  # freed at once: its __del__ runs the handler
        assert handed == [signal.SIGINT] and stop.taken == 1
        with pytest.raises(KeyboardInterrupt):  # handed on: raised again, neither counted nor dumped
            stop(signal.SIGINT, sys._getframe())
        assert stop.taken == 1 and stop.again is None
    assert "Exception ignored" not in capfd.readouterr().err


def test_abandoned_iterators_still_deliver_shut_down_as_a_no_op_and_their_workers_are_stopped():
    loader = DataLoader(torch.arange(64.0), batch_size=4, num_workers=1)
    iterator = iter(loader)
    next(iterator)
    assert abandon_iterators() >= 1 and not iterator._worker_pids_set
    assert next(iterator).tolist() == [4.0, 5.0, 6.0, 7.0]  # the script may go on before the signal is raised again
    iterator._shutdown_workers()
    assert not iterator._shutdown and iterator._workers[0].is_alive()  # torch's shutdown did nothing
    assert stop_workers() == 1
    del iterator


def test_the_handlers_are_the_scripts_only_inside_the_block():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with workers_end_quietly() as stop:
        assert signal.getsignal(signal.SIGINT) is stop and signal.getsignal(signal.SIGTERM) is stop
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
