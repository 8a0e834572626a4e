"""The page cache before a job measures: warm it, or make sure cold reads really go to storage,
and say which one serves the run.

The page cache is the kernel's: a fresh job process finds every file an earlier job (or the
corpus build) read still cached. So `dataset.cache=warm` reads every file once before measuring,
and when the files fit in free memory the job says the page cache serves it; `cold` drops each
file's pages as it reads it (pipebench.storage.file_reads), after one `sync` here, since the
kernel keeps a page that is not yet written back. Where posix_fadvise is missing, cold runs
warm, with one notice and the row labelled so.

A dataset read from URLs (`s3://...`, pipebench/storage/object_store.py) has no pages here: its
`cache_mode` is `remote`, the cache setting does nothing and the note says so, while the emulated
storage still applies.

The warm-up reads only regular files (a link is followed to one): a FIFO or a device (a link to
`/dev/zero` named `x.jpg`) is skipped and counted in a note, never opened for a blocking read.
It keeps the step watchdog's rule (pipebench.base.watchdog, run.step_timeout_s): each look at a
file and each chunk read is one step, so a read that stalls (a network filesystem gone quiet)
ends the job with one line naming the file, while a large file on slow storage that keeps
moving never trips it.
"""

import os
import stat
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Tuple

import psutil

from pipebench.base.errors import StepTimeoutError
from pipebench.base.watchdog import StepOverrun, Unwatched
from pipebench.config.specs import StorageSpec
from pipebench.storage.dataset_contract import told
from pipebench.storage.file_reads import BYTES_PER_MB, file_reads_of, honoured

__all__ = ["CachePlan", "prepare_cache"]

# Warm-up reads a file in pieces this large: the page cache keeps the pages, not the buffer.
WARM_CHUNK_BYTES = 1 << 20
# The cache mode of a dataset every file of which is a URL: no local page cache holds it.
REMOTE = "remote"


@dataclass(frozen=True)
class CachePlan:
    """What a job's reads went through: `cache_mode` actually used (None: the dataset reads no
    files through pipebench), a row note, and the lines to print before measuring."""

    cache_mode: Optional[str]
    storage: StorageSpec
    note: Optional[str]
    notices: Tuple[str, ...]

    def columns(self) -> dict:
        emulated = self.cache_mode is not None and self.storage.emulated
        return {
            "cache_mode": self.cache_mode,
            "storage_latency_ms": self.storage.latency_ms if emulated else None,
            "storage_mb_per_s": self.storage.mb_per_s if emulated else None,
            "storage_note": self.note,
        }


def _warm_file(path: str, watchdog: Unwatched, read: Callable[[int, int], bytes] = os.read) -> bool:
    """Read one file once, so the page cache holds it (the bytes are dropped), each chunk a watched
    step. False, with nothing read, when it is no longer a regular file: opened non-blocking, a FIFO
    put there since the look cannot hold the open. `read` (os.read's signature) is injectable so a
    test can stall a read."""
    what = f"page-cache warm-up: reading {path}"
    watchdog.arm(what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            while read(fd, WARM_CHUNK_BYTES):
                watchdog.arm(what)
        finally:
            os.close(fd)
    finally:
        watchdog.disarm()
    return True


def _look_and_warm(paths: Iterable[str], free: int, watchdog: Unwatched) -> Tuple[int, List[str]]:
    """The regular files' bytes and the paths that are no regular file (not read); the regular files
    are read once when their bytes fit in `free`. A watched step that overruns is a StepTimeoutError
    naming the file."""
    regular, size, skipped = [], 0, []
    try:
        for path in paths:
            watchdog.arm(f"page-cache warm-up: looking at {path}")
            try:
                info = os.stat(path)  # links followed
            finally:
                watchdog.disarm()
            if stat.S_ISREG(info.st_mode):
                regular.append(path)
                size += info.st_size
            else:
                skipped.append(path)
        if size <= free:
            skipped += [path for path in regular if not _warm_file(path, watchdog)]
    except StepOverrun as exc:
        raise StepTimeoutError(f"{exc}; stopped the job (raise it if the storage is only slow; "
                               "dataset.cache=cold skips the warm-up)") from None
    return size, skipped


def _mib(size: float) -> str:
    return f"{size / BYTES_PER_MB:,.1f} MiB"


def _remote_line(urls: List[str]) -> str:
    more = f" and {len(urls) - 1} more" if len(urls) > 1 else ""
    return (f"read from the object store ({urls[0]}{more}): no local page cache holds it, so dataset.cache "
            "does nothing for a URL")


def _emulated_note(storage: StorageSpec) -> str:
    bandwidth = f" + bytes / {storage.mb_per_s:g} MiB/s" if storage.mb_per_s is not None else ""
    shared = (f", then one {storage.shared_mb_per_s:g} MiB/s link the host's workers and ranks share"
              if storage.shared_mb_per_s is not None else "")
    return f"storage emulated: {storage.latency_ms:g} ms{bandwidth} a file read{shared}"


def prepare_cache(dataset: object, asked: StorageSpec, available_bytes: Optional[int] = None,
                  watchdog: Optional[Unwatched] = None) -> CachePlan:
    """Prepare the page cache for the mode the platform can honour and say what serves the run.

    `available_bytes`: free memory (psutil's `available`) unless given, for tests. `watchdog`: the
    job's step watchdog, entered in this (the main) thread; none bounds nothing.
    """
    reads = file_reads_of(dataset)
    if reads is None:
        notices = (f"note: dataset.cache and dataset.storage do nothing here: {type(dataset).__name__} reads no "
                   "files through pipebench",) if asked != StorageSpec() else ()
        return CachePlan(None, asked, None, notices)
    contract = told(dataset)
    urls = contract.store_urls()
    # The emulation's line, alike for the settings asked and those honoured (only cold may turn warm).
    emulated = [_emulated_note(asked)] if asked.emulated else []
    if urls and not contract.files():
        notes = [_remote_line(urls), *emulated]
        return CachePlan(REMOTE, asked, "; ".join(notes), (f"note: {notes[0]}",))
    used = honoured(asked)
    notices, notes = [], []
    if urls:
        notices.append(f"note: {_remote_line(urls)}")
        notes.append(_remote_line(urls))
    if used.cache != asked.cache:
        notices.append("note: dataset.cache=cold needs os.posix_fadvise, which this platform lacks: "
                       "the run goes on warm")
        notes.append("cold asked, ran warm: no posix_fadvise here")
    if used.cache == "cold":
        os.sync()
    else:
        free = psutil.virtual_memory().available if available_bytes is None else available_bytes
        size, skipped = _look_and_warm(contract.files(), free, watchdog or Unwatched())
        if size <= free:
            line = f"page cache serves this run: the dataset's {_mib(size)} fit in {_mib(free)} of free memory"
            notices.append(f"note: {line} (dataset.cache=cold to read from storage)")
        else:
            line = f"the dataset's {_mib(size)} exceed {_mib(free)} of free memory: reads reach storage, warm or not"
            notices.append(f"note: {line}")
        notes.append(line)
        if skipped:
            line = (f"the warm-up skipped {len(skipped)} of the dataset's files that are no regular file, not read "
                    f"(a FIFO's or a device's read may never end): {skipped[0]}"
                    + (f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""))
            notices.append(f"note: {line}")
            notes.append(line)
    notes.extend(emulated)
    return CachePlan(used.cache, used, "; ".join(notes) or None, tuple(notices))
