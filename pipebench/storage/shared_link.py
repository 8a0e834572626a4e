"""One bandwidth for a whole host: the slow-storage what-if every worker and rank draws from.

A host's DataLoader workers and torchrun ranks share one disk or one link, so an emulated storage
of M MiB/s must let all of them together read M MiB/s, not M each (a sleep per read would give 8
workers 8M). The link is a small file holding the time (CLOCK_MONOTONIC, one clock for every
process of the host) at which the link is next free. A read of `size` bytes takes the file's lock
(fcntl.flock), reserves [max(now, next_free), that + size / M), writes the reservation's end back,
lets the lock go and sleeps until the end: reads queue on the link as they would on the wire.

The file's path reaches every process through the job's spec (`StorageSpec.link`, set by
`opened_link` where a job starts), so forked and spawned workers and every rank of a job find the
same file; nothing here is global. Each process opens the file itself (a descriptor inherited
through fork shares its lock with the parent, so it would not keep the two apart).
"""

import fcntl
import os
import struct
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager, suppress
from dataclasses import replace
from typing import Callable, Iterator, Optional, Tuple

from pipebench.config.specs import JobSpec

__all__ = ["LINK_PREFIX", "SharedLink", "link_folder", "opened_link"]

BYTES_PER_MB = 1 << 20
# The file holds one double: the link's next free time, in seconds of CLOCK_MONOTONIC.
_NEXT_FREE = struct.Struct("<d")
# The link files' name prefix, so a leftover one (a job killed with SIGKILL) is recognisable.
LINK_PREFIX = "pipebench-link-"
# /dev/shm is memory: taking the lock and reading 8 bytes there costs microseconds a read, nothing
# against the milliseconds a read of an emulated storage lasts. Elsewhere the temporary folder.
_SHM = "/dev/shm"


def link_folder() -> str:
    """Where link files go: /dev/shm where it is writable, else the temporary folder."""
    return _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK) else tempfile.gettempdir()


class SharedLink:
    """The host's one link of `mb_per_s` MiB/s, kept in the file at `path` (module doc).

    `clock` and `sleep` are injectable so a test can read the schedule without waiting on it; both
    must pickle (workers get a copy), as time.monotonic and time.sleep do.
    """

    def __init__(self, path: Optional[str], mb_per_s: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        # None: a link of this process alone (a dataset built outside a job, which no job's workers share).
        self.path = path
        self._next_free = 0.0
        self.mb_per_s = mb_per_s
        self.clock = clock
        self.sleep = sleep
        self._fd: Optional[int] = None
        self._pid: Optional[int] = None
        # flock keeps processes apart; threads of one process share a descriptor, so a lock of their own.
        self._threads = threading.Lock()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None, "_pid": None, "_threads": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._threads = threading.Lock()

    def _descriptor(self) -> int:
        """This process's own descriptor of the link file (reopened after a fork)."""
        if self._fd is None or self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDWR)
            self._pid = os.getpid()
        return self._fd

    def reserve(self, size: int) -> Tuple[float, float]:
        """Reserve the link for `size` bytes: (start, end) in the clock's seconds, the next free slot."""
        duration = size / (self.mb_per_s * BYTES_PER_MB)
        with self._threads:
            if self.path is None:
                start = max(self.clock(), self._next_free)
                self._next_free = start + duration
                return start, self._next_free
            fd = self._descriptor()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                stored = os.pread(fd, _NEXT_FREE.size, 0)
                next_free = _NEXT_FREE.unpack(stored)[0] if len(stored) == _NEXT_FREE.size else 0.0
                start = max(self.clock(), next_free)
                end = start + duration
                os.pwrite(fd, _NEXT_FREE.pack(end), 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        return start, end

    def transfer(self, size: int) -> Tuple[float, float]:
        """Reserve the link for `size` bytes and sleep until the reservation ends; the reservation."""
        start, end = self.reserve(size)
        left = end - self.clock()
        if left > 0:
            self.sleep(left)
        return start, end


@contextmanager
def opened_link(spec: JobSpec) -> Iterator[JobSpec]:
    """`spec` with a link file of its own for the job's shared bandwidth, removed when the job ends;
    `spec` itself where it asks for none (dataset.storage.shared_mb_per_s unset) or names one already."""
    storage = spec.storage
    if storage.shared_mb_per_s is None or storage.link is not None:
        yield spec
        return
    path = os.path.join(link_folder(), f"{LINK_PREFIX}{os.getpid()}-{uuid.uuid4().hex}")
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        yield replace(spec, storage=replace(storage, link=path))
    finally:
        with suppress(FileNotFoundError):
            os.unlink(path)
