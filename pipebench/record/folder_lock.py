"""One run at a time in a results folder: an exclusive flock on a file inside it.

Two runs writing one invocation folder would interleave their jobs' rows (two resumes of the same
interrupted sweep, say). The kernel drops a flock when its holder's last descriptor closes, a
killed process included, so a crash never leaves a stale lock behind.

The lock file is the one file pipebench writes in place (its holder's pid), so it must be a file of
the folder's own: a symbolic link (O_NOFOLLOW), a hard link to a file elsewhere, or anything but a
regular file is refused, with one line saying so, before anything is written into it.
"""

import errno
import fcntl
import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipebench.base.errors import PipebenchError
from pipebench.base.io import with_name

__all__ = ["LOCK_FILE", "FolderBusy", "LockRefused", "folder_lock"]

LOCK_FILE = ".pipebench.lock"
# Owner read-write: other users may read who holds it, never replace it.
LOCK_MODE = 0o644


class FolderBusy(PipebenchError):
    """Another pipebench process holds the folder's lock."""


class LockRefused(PipebenchError):
    """The lock file is a link or not a regular file: writing the pid into it would write elsewhere."""


def _refused(path: Path, what: str) -> LockRefused:
    return LockRefused(f"refused {path} as the folder's lock: it is {what}; pipebench writes its process id "
                       "into its lock file, so the lock must be a file of the folder's own; remove that name "
                       "(nothing else is touched) and run again")


def _open_own(path: Path) -> int:
    """The lock file, created if absent, opened only if it is a regular file with no other name."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise _refused(path, f"a symbolic link to {os.readlink(path)}") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise _refused(path, f"a hard link ({info.st_nlink} names for one file)" if stat.S_ISREG(info.st_mode)
                       else "not a regular file")
    return fd


@contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Hold `folder`'s lock for the block, or raise FolderBusy at once; the lock file's text is the
    holder's process id, for a person who wants to know who. A link there is refused (LockRefused)."""
    path = folder / LOCK_FILE
    fd = _open_own(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = "".join(ch for ch in os.pread(fd, 32, 0).decode(errors="replace") if ch.isdigit()) or "unknown"
            raise FolderBusy(f"{folder} is in use by another pipebench run (process {holder} holds {path}); "
                             "wait for it, or pass --fresh for a new folder") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            raise with_name(exc, path) from None
        yield
    finally:
        os.close(fd)
