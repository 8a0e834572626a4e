"""Tie a process to its parent's life: when the parent dies, however it dies, the kernel kills it.

Linux's PR_SET_PDEATHSIG makes the kernel send a signal to a process the moment the thread that
started it ends, SIGKILL of the parent included, which no handler in the parent can catch. A
process that sets it checks right after that its parent is still there (it may have died in
between). Every process of a sweep sets it: the job process (parent: the `pipebench` process),
DataLoader workers (parent: the job process, or its forkserver), torchrun (a fork of the job, or of
`pipebench attach`) and the torchrun ranks. Elsewhere than Linux it does nothing, and the
launcher's process-group kill is what remains.
"""

import ctypes
import multiprocessing
import os
import signal
import sys
from typing import Callable

__all__ = ["TIED_PID_ENV", "die_with_parent", "multiprocessing_parent_alive", "parent_is"]

# <linux/prctl.h>: set the signal sent to this process when its parent ends.
PR_SET_PDEATHSIG = 1
# SIGKILL: a process whose parent died has no one to report to, and nothing it holds must outlive
# the sweep (DataLoader workers, torchrun ranks); a catchable signal could be ignored or hang.
DEATH_SIGNAL = signal.SIGKILL
# The pid of torchrun's fork (pipebench.measure.distributed.torchrun_fork), for the ranks it starts
# to check their parent against as they tie themselves: torchrun passes its environment to them.
TIED_PID_ENV = "PIPEBENCH_TIED_PID"


def parent_is(pid: int) -> Callable[[], bool]:
    """A liveness check for `die_with_parent`: this process's parent is still `pid`."""
    return lambda: os.getppid() == pid


def multiprocessing_parent_alive() -> bool:
    """A liveness check for a multiprocessing child: the process that asked for it (not a forkserver
    that forked it) is alive."""
    parent = multiprocessing.parent_process()
    return parent is None or parent.is_alive()


def die_with_parent(parent_alive: Callable[[], bool]) -> None:
    """Be killed when the parent dies; die now if `parent_alive()` says it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(DEATH_SIGNAL), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if not parent_alive():
        os.kill(os.getpid(), DEATH_SIGNAL)
