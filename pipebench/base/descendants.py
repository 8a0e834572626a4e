"""Nothing a command starts outlives it: its orphans adopted, and what is left of them ended.

torchrun starts each rank in a session of its own, and a rank's DataLoader workers live in the
rank's session, so no one process-group signal reaches them all, and a process whose parent ends
is reparented away from the tree. Within `no_descendant_outlives`, this process is a child
subreaper (Linux's PR_SET_CHILD_SUBREAPER): every descendant orphaned inside the block is
reparented to it, so on the way out all of them are among its descendants, and those that were
not there before the block get SIGTERM, then SIGKILL after END_GRACE_S. Elsewhere than Linux
the adoption does nothing, and only the descendants still in the tree are ended.
"""

import ctypes
import signal
import sys
from contextlib import contextmanager, suppress
from typing import Iterator, List, Set

import psutil

__all__ = ["END_GRACE_S", "end_descendants", "no_descendant_outlives"]

# <linux/prctl.h>: mark this process a subreaper of its orphaned descendants / read the mark.
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
# A descendant left at the end gets this long after SIGTERM to write what it holds and go (a
# DataLoader worker's clean exit takes well under a second) before SIGKILL.
END_GRACE_S = 5.0


def _subreaper(libc: "ctypes.CDLL", on: int) -> int:
    """Set the subreaper mark; the mark it had before."""
    before = ctypes.c_int(0)
    libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, on, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    return before.value


def _descendants() -> List[psutil.Process]:
    return psutil.Process().children(recursive=True)


def end_descendants(keep: Set[int], grace_s: float = END_GRACE_S) -> int:
    """SIGTERM every live descendant whose pid is not in `keep`, SIGKILL what is left after
    `grace_s`, and reap them; how many there were."""
    found = [p for p in _descendants() if p.pid not in keep]
    left = found
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in left:
            with suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)
        _, left = psutil.wait_procs(left, timeout=grace_s)
        if not left:
            break
    return len(found)


@contextmanager
def no_descendant_outlives() -> Iterator[None]:
    """Within the block this process adopts its orphaned descendants; on the way out, whatever
    happens, every descendant started inside the block and still alive is ended."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    keep = {p.pid for p in _descendants()}
    before = _subreaper(libc, 1) if libc is not None else None
    try:
        yield
    finally:
        end_descendants(keep)
        if libc is not None and before is not None:
            _subreaper(libc, before)
