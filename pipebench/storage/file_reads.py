"""Whole-file reads for file-backed datasets: the cache mode, an emulated storage, and a count.

A dataset that reads files holds a `FileReads` as its `reads` attribute and reads every file
through it. Each process has its own copy (a DataLoader worker gets the dataset's copy), so its
counters say what that process read; the timed chain takes their difference around each
sample's load step, which is how bytes and read time ride back with the batch from workers.

- cold: the file's pages are dropped (posix_fadvise DONTNEED, no root needed) before it is read,
  so the read goes to storage, as every read of a set larger than RAM does.
- emulated storage: after the real read, sleep latency + bytes / bandwidth, the way
  `consumer=emulated` stands in for an accelerator. The sleep counts as read time. With
  `shared_mb_per_s`, the bytes then cross the host's one link (pipebench.storage.shared_link),
  which every worker and rank of the job shares, so together they read no faster than it.

Read time covers open and read, not the page drop (pipebench's own work, not the storage's).

A format that reads a file in pieces (a tar shard as its samples stream past, a Parquet file's row
groups) opens it with `open`: each read is counted as it happens, so each sample's load step gets the
bytes it pulled, a cold read drops the pages of the range it reads first, and the emulated storage
sleeps its latency once an open and its bandwidth on every read. A URL (`s3://...`) opens through
fsspec (pipebench/storage/object_store.py); the cache mode does not apply to it (no local page cache
holds it), the emulated storage does, and its figures are a local file's: bytes, time, opens and requests.

Besides time, bytes and files, each process counts the requests its reads sent to storage (a whole
file's read, each piece read from a local file, each ranged GET fsspec sent for a URL's object: its
read-ahead cache's misses, so the 1 MiB pieces of one GET are one request) and the time in opens
alone (a URL's open asks the store for the object's size: that look-up is the open's, not a request).
"""

import io
import os
import threading
import time
from dataclasses import replace
from typing import Any, BinaryIO, Callable, List, Optional, Tuple

import numpy as np

from pipebench.config.specs import StorageSpec
from pipebench.storage.object_store import is_url, url_fs
from pipebench.storage.shared_link import BYTES_PER_MB, SharedLink

__all__ = ["CountedFile", "FileReads", "IO_FIELDS", "NO_IO", "OPEN_NS", "PerThread", "READ_BYTES",
           "READ_FILES", "READ_NS", "READ_REQUESTS", "file_reads_of", "honoured"]

SECONDS_PER_MS = 1e-3
# A file read in pieces (`FileReads.open`) is read this much at a time: a cold read drops the pages of
# each piece before reading it, so a small piece would drop what the kernel read ahead for the next.
READ_PIECE_BYTES = 1 << 20
# What one sample's load step read, in this order, as int64: time in opens and reads (ns), bytes, files
# opened, requests sent to storage, and time in opens alone (ns, part of read_ns).
IO_FIELDS = ("read_ns", "read_bytes", "read_files", "read_requests", "open_ns")
READ_NS, READ_BYTES, READ_FILES, READ_REQUESTS, OPEN_NS = range(len(IO_FIELDS))
NO_IO = np.zeros(len(IO_FIELDS), dtype=np.int64)


def honoured(storage: StorageSpec) -> StorageSpec:
    """The settings this platform can honour: cold runs warm where pages cannot be dropped (posix_fadvise:
    Linux and most Unixes, not macOS or Windows)."""
    if storage.cache == "cold" and not (hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_DONTNEED")):
        return replace(storage, cache="warm")
    return storage


class PerThread:
    """State kept per thread in `_local` (a threading.local): it does not pickle, so a copy in another
    process (a DataLoader worker's) starts with none."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __getstate__(self) -> dict:
        return {name: value for name, value in self.__dict__.items() if name != "_local"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def mine(self, name: str, make: Callable[[], Any]) -> Any:
        """This thread's `name`, made by `make()` the first time the thread asks for it."""
        value = getattr(self._local, name, None)
        if value is None:
            value = make()
            setattr(self._local, name, value)
        return value


def _new_tally() -> List[int]:
    return [0] * len(IO_FIELDS)


class FileReads(PerThread):
    """Reads whole files as `storage` asks and counts what it read (IO_FIELDS).

    `sleep` is injectable so a test can check the emulated wait without waiting; it must pickle
    (workers get a copy), as time.sleep does.
    """

    def __init__(self, storage: StorageSpec = StorageSpec(), sleep: Callable[[float], None] = time.sleep) -> None:
        # Counted per thread: under a thread backend (loader.backend=threads, spdl) several threads
        # read at once, and each sample's `since` must see only its own thread's reads.
        super().__init__()
        self.sleep = sleep
        self.use(storage)

    def _tally(self) -> List[int]:
        """This thread's counts, in IO_FIELDS order (a worker's copy counts from zero). Inside the timed
        reads: once made, a thread's tally is one attribute read."""
        return getattr(self._local, "tally", None) or self.mine("tally", _new_tally)

    def use(self, storage: StorageSpec) -> None:
        """Read as `storage` says from now on (the job sets the mode it can honour), across the host's
        shared link where it names one."""
        self.storage = storage
        self.link = (None if storage.shared_mb_per_s is None
                     else SharedLink(storage.link, storage.shared_mb_per_s, sleep=self.sleep))

    def _emulate(self, size: int, latency: bool = True) -> None:
        """The emulated storage's wait for a read of `size` bytes: its own sleep (without the latency for
        a file's further pieces), then the shared link."""
        wait = self.storage.latency_ms * SECONDS_PER_MS if latency else 0.0
        if self.storage.mb_per_s is not None:
            wait += size / (self.storage.mb_per_s * BYTES_PER_MB)
        if wait > 0:
            self.sleep(wait)
        if self.link is not None and size:
            self.link.transfer(size)

    def draw(self, size: int) -> None:
        """A read of `size` bytes from no file (a generated sample standing for one): the emulated
        storage's wait, counted as one file read of `size` bytes."""
        start = time.perf_counter_ns()
        self._emulate(size)
        tally = self._tally()
        tally[READ_NS] += time.perf_counter_ns() - start
        tally[READ_BYTES] += size
        tally[READ_FILES] += 1
        tally[READ_REQUESTS] += 1

    def read(self, path: str) -> bytes:
        """The file's bytes, read as the cache mode and the emulated storage say, and counted."""
        start = time.perf_counter_ns()
        with open(path, "rb") as f:
            opened = time.perf_counter_ns()
            if self.storage.cache == "cold":
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            dropped = time.perf_counter_ns()
            data = f.read()
        if self.storage.emulated:
            self._emulate(len(data))
        tally = self._tally()
        tally[READ_NS] += time.perf_counter_ns() - dropped + opened - start
        tally[READ_BYTES] += len(data)
        tally[READ_FILES] += 1
        tally[READ_REQUESTS] += 1
        tally[OPEN_NS] += opened - start
        return data

    def open(self, path: str) -> BinaryIO:
        """`path` opened for reading in pieces, every read counted and read as the storage says (a
        CountedFile, buffered). The open counts as one file read: the emulated latency is slept here."""
        start = time.perf_counter_ns()
        if is_url(path):
            fs, where = url_fs(path)
            raw = fs.open(where, "rb")
        else:
            raw = open(path, "rb", buffering=0)
        if self.storage.latency_ms > 0:
            self.sleep(self.storage.latency_ms * SECONDS_PER_MS)
        tally = self._tally()
        opening = time.perf_counter_ns() - start
        tally[READ_NS] += opening
        tally[OPEN_NS] += opening
        tally[READ_FILES] += 1
        cold = self.storage.cache == "cold" and not is_url(path)
        return io.BufferedReader(CountedFile(raw, self, cold), READ_PIECE_BYTES)

    def counts(self) -> Tuple[int, ...]:
        """What this thread read so far through this process's copy, in IO_FIELDS order."""
        return tuple(self._tally())

    def since(self, before: Tuple[int, ...]) -> np.ndarray:
        """What was read since `counts()` returned `before`, as an IO_FIELDS row."""
        return np.subtract(self.counts(), before, dtype=np.int64)


def file_reads_of(dataset: object) -> Optional[FileReads]:
    """The dataset's FileReads, or None when it reads no files through one."""
    reads = getattr(dataset, "reads", None)
    return reads if isinstance(reads, FileReads) else None


def _fetches(raw: BinaryIO) -> Optional[int]:
    """The requests a URL's fsspec file has sent to its store so far (its cache's misses: one ranged
    GET each), or None for a local file, where every read is one request."""
    return getattr(getattr(raw, "cache", None), "miss_count", None)


class CountedFile(io.RawIOBase):
    """A file read in pieces through `reads`: each read's time, bytes and requests go to the reading
    thread's tally, a cold read first drops the pages of the range it reads, and an emulated bandwidth
    sleeps bytes / mb_per_s a read (and crosses the shared link). Seekable when the file is, so pyarrow can read a Parquet footer."""

    def __init__(self, raw: BinaryIO, reads: FileReads, cold: bool) -> None:
        super().__init__()
        self.raw = raw
        self.reads = reads
        self.cold = cold

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self.raw.seekable()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def readall(self) -> bytes:
        """The rest of the file, read a piece at a time (RawIOBase's would read 8 KiB pieces)."""
        pieces = []
        piece = bytearray(READ_PIECE_BYTES)
        while True:
            size = self.readinto(piece)
            if not size:
                return b"".join(pieces)
            pieces.append(bytes(piece[:size]))

    def readinto(self, buffer) -> int:
        if self.cold:
            os.posix_fadvise(self.raw.fileno(), self.raw.tell(), len(buffer), os.POSIX_FADV_DONTNEED)
        fetched = _fetches(self.raw)
        start = time.perf_counter_ns()
        data = self.raw.read(len(buffer))
        size = len(data)
        buffer[:size] = data
        self.reads._emulate(size, latency=False)
        tally = self.reads._tally()
        tally[READ_NS] += time.perf_counter_ns() - start
        tally[READ_BYTES] += size
        tally[READ_REQUESTS] += int(size > 0) if fetched is None else _fetches(self.raw) - fetched
        return size

    def close(self) -> None:
        if not self.closed:
            self.raw.close()
        super().close()
