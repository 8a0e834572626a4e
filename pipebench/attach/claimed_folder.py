"""A results folder claimed for one run before it measures: created (a fresh name, or the folder the
user named), locked (`folder_lock`, as `run` locks its folders) and empty of any earlier run.

attach runs the user's script for minutes or hours before it has anything to write; a folder it
could not write, or one that another run is writing or has written, must stop it before the script
starts, not after, when the measurement would be lost or mixed with the other run's rows.
"""

import shutil
from fnmatch import fnmatch
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

from pipebench.attach.watched_ranks import RANKS_FOLDER
from pipebench.base.errors import ConfigError, error_line
from pipebench.record.folder_lock import LOCK_FILE, FolderBusy, folder_lock
from pipebench.record.results import JOB_RESULT_GLOB, SUMMARY_CSV
from pipebench.record.resume import new_folder

__all__ = ["BUSY_ADVICE", "claimed_folder"]

# At most this many of a folder's entries are named in the line that refuses it.
NAMED_AT_MOST = 3
# What an attach run writes in its folder (jobs, ranks, tables, report, plots, logs): --force removes
# these and nothing else, so a user's own file beside them (`--out .` in a project) is never deleted.
WRITTEN_BY_ATTACH = ("job-*", RANKS_FOLDER, "summary.*", "comparison.*", "transforms.*", "report.md", "*.png",
                     # attach --record's (pipebench.attach.recorder)
                     "series.csv", "events.csv", "capture-*")
# What to do about a folder another run holds, in attach's own flags: the lock's line names `run`'s
# --fresh, which attach has not; --force does not help either (it replaces a finished run, never a
# running one's folder), so the way out is another folder.
BUSY_ADVICE = "wait for it, or give another --out (without --out, attach makes a new folder)"


def _entries(folder: Path) -> List[Path]:
    """What the folder holds besides its lock."""
    return sorted(p for p in folder.iterdir() if p.name != LOCK_FILE)


def _names(entries: List[Path]) -> str:
    more = len(entries) - NAMED_AT_MOST
    return ", ".join(p.name for p in entries[:NAMED_AT_MOST]) + (f" and {more} more" if more > 0 else "")


def _holds_results(folder: Path) -> bool:
    """Whether pipebench wrote results here: a job's result.json, the summary, or a torchrun run's ranks."""
    return any(folder.glob(JOB_RESULT_GLOB)) or (folder / SUMMARY_CSV).exists() or (folder / RANKS_FOLDER).exists()


def _remove(entry: Path) -> None:
    """Remove a file, a link (never its target) or a folder tree."""
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()


def _emptied(folder: Path, force: bool) -> None:
    """Refuse a folder that holds anything; with `force`, empty one that holds pipebench's results.
    A folder of other files (`--out .`) is never emptied: --force replaces results, nothing else."""
    entries = _entries(folder)
    if not entries:
        return
    if not force:
        raise ConfigError(f"{folder} already holds {_names(entries)}: its run would be mixed with this one; "
                          "give another --out, or pass --force to replace it")
    if not _holds_results(folder):
        raise ConfigError(f"--force replaces a results folder, and {folder} holds no pipebench results "
                          f"({_names(entries)}): give another --out")
    foreign = [e for e in entries if not any(fnmatch(e.name, pattern) for pattern in WRITTEN_BY_ATTACH)]
    if foreign:
        raise ConfigError(f"--force replaces a results folder, and {folder} also holds {_names(foreign)}, "
                          "which attach does not write: give another --out, or move them")
    for entry in entries:
        _remove(entry)


def _made(folder: Path) -> bool:
    """Create `folder` (and its parents); whether this call created it. One line when it cannot be."""
    try:
        folder.mkdir(parents=True)
        return True
    except FileExistsError:
        if folder.is_dir():
            return False
        raise ConfigError(f"--out {folder} is a file, not a folder") from None
    except OSError as exc:
        raise ConfigError(f"--out {folder}: the results folder cannot be created ({error_line(exc)})") from None


@contextmanager
def claimed_folder(out: Optional[Path], fresh_name: Path, force: bool = False) -> Iterator[Path]:
    """The results folder `out`, or a new one named `fresh_name` (`-2`, `-3`, ... when a run started
    in the same second took it), locked for the block and empty of any earlier run (see `_emptied`).
    Raises ConfigError, or FolderBusy while another run holds it. A folder the block left with
    nothing in it is removed again (only its lock, if the user's folder was there before)."""
    folder, created = (new_folder(fresh_name), True) if out is None else (out, _made(out))
    try:
        with ExitStack() as held:
            try:
                held.enter_context(folder_lock(folder))
            except FolderBusy as exc:  # the holder named as the lock names it, with attach's way out
                raise FolderBusy(f"{str(exc).rsplit('; ', 1)[0]}; {BUSY_ADVICE}") from None
            _emptied(folder, force)
            try:
                yield folder
            finally:
                if not _entries(folder):
                    (folder / LOCK_FILE).unlink(missing_ok=True)
    finally:
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
