"""A deadline on the main thread's steps: a step that overruns is interrupted where it is.

`arm(what)` before a step and `disarm()` after cost two attribute writes, so the watchdog can sit
on every step of a measured loop. A daemon thread sleeps until the deadline of the step armed
when it last looked; only then, if that step is still running, it sends SIGALRM to the main
thread, whose handler raises `StepOverrun` there: inside a pure-Python busy loop at the next
bytecode, inside `time.sleep` at once (the signal interrupts the system call). Native code that
never returns is the one thing a Python exception cannot reach: `grace_s` later the thread calls
`on_stuck` with one line and ends the process (it needs the GIL for that, so native code that
spins holding the GIL stays out of reach).
"""

import os
import signal
import threading
import time
from typing import Callable, Optional, Tuple

__all__ = ["STUCK_EXIT_STATUS", "StepOverrun", "Unwatched", "Watchdog"]

# The signal the watchdog interrupts the main thread with: it interrupts a blocking system call,
# and nothing else in a job process uses it.
INTERRUPT_SIGNAL = signal.SIGALRM
# After the interrupt, how long a step stuck in native code gets before the process is ended:
# long enough for any native call that checks for signals to return.
STUCK_GRACE_S = 10.0
# Exit status of a process the watchdog ended: the step's code hung, which is the user's to fix.
STUCK_EXIT_STATUS = 2


class StepOverrun(BaseException):
    """Raised in the main thread when a watched step passes its deadline.

    A BaseException, so a transform's own `except Exception` (and the timed chain's bad-sample
    handler) cannot swallow it. `what` is the step the loop armed; `where`, once a layer that knows
    has said so, the transform and sample it interrupted; `limit` the setting it ran past.
    """

    def __init__(self, what: str, limit: str, where: str = "") -> None:
        super().__init__(what, limit, where)
        self.what = what
        self.limit = limit
        self.where = where

    def at(self, where: str) -> "StepOverrun":
        """The same overrun, naming the step and sample it interrupted."""
        return StepOverrun(self.what, self.limit, where)

    def __str__(self) -> str:
        return f"{self.where or self.what} ran past {self.limit}"


class Unwatched:
    """Where no deadline applies: the Watchdog's arm and disarm, doing nothing."""

    def arm(self, what: str) -> None:
        pass

    def disarm(self) -> None:
        pass


class Watchdog(Unwatched):
    """Interrupts the main thread when an armed step runs past `limit_s`, the setting `key` (see the
    module doc). It watches when entered in the main thread, which alone can take a signal handler;
    entered in another thread it does nothing.
    """

    def __init__(self, limit_s: float, key: str, on_stuck: Callable[[str], None],
                 grace_s: float = STUCK_GRACE_S) -> None:
        self.limit_s = limit_s
        self.limit = f"{key}={limit_s:g}"
        self.grace_s = grace_s
        self.on_stuck = on_stuck
        # (deadline on time.monotonic(), what) of the running step; replaced, never mutated.
        self._armed: Optional[Tuple[float, str]] = None
        # The thread has interrupted a step and waits out the grace period: arm and disarm wake it.
        self._fired = False
        self._stopping = False
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._previous_handler = None
        self._main_thread = 0

    def __enter__(self) -> "Watchdog":
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread takes signal handlers: unwatched, as before
        self._main_thread = threading.get_ident()
        self._previous_handler = signal.signal(INTERRUPT_SIGNAL, self._interrupt)
        self._thread = threading.Thread(target=self._watch, name="pipebench-watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._armed = None
        if self._thread is None:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join()
        signal.signal(INTERRUPT_SIGNAL, self._previous_handler)

    def arm(self, what: str) -> None:
        self._armed = (time.monotonic() + self.limit_s, what)
        if self._fired:
            self._wake.set()

    def disarm(self) -> None:
        self._armed = None
        if self._fired:
            self._wake.set()

    def _interrupt(self, signum: int, frame) -> None:
        armed = self._armed
        # A step that ended just before the signal landed is no overrun.
        if armed is not None and time.monotonic() >= armed[0]:
            raise StepOverrun(armed[1], self.limit)

    def _sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _watch(self) -> None:
        while not self._stopping:
            armed = self._armed
            wait = self.limit_s if armed is None else armed[0] - time.monotonic()
            if wait > 0:
                self._sleep(wait)
                continue
            self._fired = True
            signal.pthread_kill(self._main_thread, INTERRUPT_SIGNAL)
            self._sleep(self.grace_s)
            self._fired = False
            if not self._stopping and self._armed is armed:
                self.on_stuck(f"{armed[1]} ran past {self.limit} and did not stop when interrupted "
                              f"{self.grace_s:g} s later (stuck in native code); ended the job")
                os._exit(STUCK_EXIT_STATUS)
