"""One run at a time in a results folder: an exclusive flock on a file inside it.

Two runs writing one invocation folder would interleave their jobs' rows (two resumes of the same
interrupted sweep, say). The kernel drops a flock when its holder's last descriptor closes, a
killed process included, so a crash never leaves a stale lock behind.
"""

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipebench.base.errors import PipebenchError

__all__ = ["LOCK_FILE", "FolderBusy", "folder_lock"]

LOCK_FILE = ".pipebench.lock"
# Owner read-write: other users may read who holds it, never replace it.
LOCK_MODE = 0o644


class FolderBusy(PipebenchError):
    """Another pipebench process holds the folder's lock."""


@contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold `folder`'s lock for the block, or raise FolderBusy at once; the lock file's text is the
    holder's process id, for a person who wants to know who. A planted symlink is refused (O_NOFOLLOW)."""
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = "".join(ch for ch in os.pread(fd, 32, 0).decode(errors="replace") if ch.isdigit()) or "unknown"
            raise FolderBusy(f"{folder} is in use by another pipebench run (process {holder} holds {path}); "
                             "wait for it, or pass --fresh for a new folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
