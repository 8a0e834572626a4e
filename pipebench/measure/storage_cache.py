"""The page cache before a job measures: warm it, or make sure cold reads really go to storage,
and say which one serves the run.

The page cache is the kernel's: a fresh job process finds every file an earlier job (or the
corpus build) read still cached. So `dataset.cache=warm` reads every file once before measuring,
and when the files fit in free memory the job says the page cache serves it; `cold` drops each
file's pages as it reads it (pipebench.pipeline.file_reads), after one `sync` here, since the
kernel keeps a page that is not yet written back. Where posix_fadvise is missing, cold runs
warm, with one notice and the row labelled so.
"""

import os
from dataclasses import dataclass
from typing import Optional, Tuple

import psutil

from pipebench.config.specs import StorageSpec
from pipebench.pipeline.file_reads import BYTES_PER_MB, file_reads_of, honoured

__all__ = ["CachePlan", "prepare_cache"]

# Warm-up reads a file in pieces this large: the page cache keeps the pages, not the buffer.
WARM_CHUNK_BYTES = 1 << 20


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


def _warm(paths) -> None:
    """Read every file once, so the page cache holds it (the bytes themselves are dropped)."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(WARM_CHUNK_BYTES):
                pass


def _mib(size: float) -> str:
    return f"{size / BYTES_PER_MB:,.1f} MiB"


def prepare_cache(dataset: object, asked: StorageSpec, available_bytes: Optional[int] = None) -> CachePlan:
    """Prepare the page cache for the mode the platform can honour and say what serves the run.

    `available_bytes`: free memory (psutil's `available`) unless given, for tests.
    """
    reads = file_reads_of(dataset)
    if reads is None:
        ignored = asked != StorageSpec()
        notices = (f"note: dataset.cache and dataset.storage do nothing here: {type(dataset).__name__} reads no "
                   "files through pipebench",) if ignored else ()
        return CachePlan(None, asked, None, notices)
    used = honoured(asked)
    notices, notes = [], []
    if used.cache != asked.cache:
        notices.append("note: dataset.cache=cold needs os.posix_fadvise, which this platform lacks: "
                       "the run goes on warm")
        notes.append("cold asked, ran warm: no posix_fadvise here")
    files = getattr(dataset, "files", lambda: [])()
    size = sum(os.path.getsize(path) for path in files)
    free = psutil.virtual_memory().available if available_bytes is None else available_bytes
    if used.cache == "cold":
        os.sync()
    elif size <= free:
        _warm(files)
        line = f"page cache serves this run: the dataset's {_mib(size)} fit in {_mib(free)} of free memory"
        notices.append(f"note: {line} (dataset.cache=cold to read from storage)")
        notes.append(line)
    else:
        line = f"the dataset's {_mib(size)} exceed {_mib(free)} of free memory: reads reach storage, warm or not"
        notices.append(f"note: {line}")
        notes.append(line)
    if used.emulated:
        bandwidth = f" + bytes / {used.mb_per_s:g} MiB/s" if used.mb_per_s is not None else ""
        notes.append(f"storage emulated: {used.latency_ms:g} ms{bandwidth} a file read")
    return CachePlan(used.cache, used, "; ".join(notes) or None, tuple(notices))
