"""Resume an interrupted sweep: invocation.json records what a `pipebench run` swept.

Re-running the identical command (same overrides, same results_dir) reuses the latest unfinished
folder that recorded the same sweep, and the launcher skips each job whose folder holds a sound
result.json of the same overrides and resolved config. A stored job it cannot trust (damaged, other
overrides, a transform's YAML edited between the runs) runs again, with one line saying why. A
finished invocation, or `--fresh`, starts a new folder.

A resumed folder may be shared (a network file system, CI artifacts), so nothing is written through
a link there: a linked folder in it is refused before anything runs (`ready_for_sweep`), and a job
that runs again first drops the links in its folder (`drop_links`), for the files Hydra writes in place.
"""

import copy
import json
import os
import stat
import time
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence, Tuple

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from pipebench.base.errors import PipebenchError, warn
from pipebench.base.io import write_json_atomic
from pipebench.base.typed_json import parse
from pipebench.record.folder_lock import LOCK_FILE
from pipebench.record.jobs import HYDRA_PREFIX, JobResult
from pipebench.record.results import (
    RESULT_FILE,
    flat_config,
    read_result,
    scan_job_results,
)
from pipebench.record.stored import (
    NUMBER,
    TEXTS,
    DamagedFile,
    NewerFile,
    check_fields,
    list_of,
    read_stored,
    versioned,
)

INVOCATION_FILE = "invocation.json"
# Hydra's sweeper saves the sweep's config here at every start, writing in place (OmegaConf.save).
HYDRA_SWEEP_FILE = "multirun.yaml"
# Where a stored result that resume will not keep goes: out of every table, still there to inspect.
REJECTED_FILE = "result.rejected.json"
# The longest stored value a message shows.
SHOWN_CHARS = 80
INVOCATION_FIELDS = {"command": TEXTS, "swept": TEXTS, "jobs": list_of(TEXTS, "an array of string arrays"),
                     "created": NUMBER}


@dataclass(frozen=True)
class InvocationChoice:
    """Where a run writes, and how many of its jobs an earlier, interrupted run already finished."""

    folder: Path
    done: int
    total: int
    resumed: bool


@dataclass(frozen=True)
class Invocation:
    """invocation.json, read by name once: the command a run was given, the keys it swept, each job's
    overrides and when it was made."""

    command: Tuple[str, ...]
    swept: Tuple[str, ...]
    jobs: Tuple[Sequence[str], ...]
    created: float


@dataclass(frozen=True)
class StoredJob:
    """Whether a job folder holds a result the sweep can keep, and if it holds one it cannot, why."""

    done: bool
    reason: str = ""


def task_overrides(job: Sequence[str]) -> Tuple[str, ...]:
    """A job's overrides as its result.json records them: Hydra keeps `hydra.*` ones out."""
    return tuple(o for o in job if not o.startswith(HYDRA_PREFIX))


def _shown(flat: Mapping[str, object], key: str) -> str:
    return _brief(flat[key]) if key in flat else "absent"


def _brief(value: object) -> str:
    """A stored value for a message: its repr, cut short (a damaged file may hold anything)."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def _config_difference(stored: Mapping[str, object], wanted: Mapping[str, object]) -> str:
    """'' when equal, else the first differing dotted key with both values (and how many more differ);
    compared as JSON text, so a NaN equals a NaN."""
    old, new = flat_config(stored), flat_config(wanted)
    keys = [k for k in sorted(set(old) | set(new))
            if k not in old or k not in new or json.dumps(old[k]) != json.dumps(new[k])]
    if not keys:
        return ""
    more = f" and {len(keys) - 1} more key(s)" if len(keys) > 1 else ""
    return f"stored config differs at {keys[0]} (stored {_shown(old, keys[0])}, now {_shown(new, keys[0])}){more}"


def stored_job(job_dir: Path, overrides: Sequence[str], config: Mapping[str, object]) -> StoredJob:
    """Done when job_dir's result.json is sound and of exactly these overrides and this resolved config."""
    path = job_dir / RESULT_FILE
    if not path.exists():
        return StoredJob(False)
    try:
        result = JobResult.from_stored(read_result(path))
    except (DamagedFile, NewerFile) as exc:
        return StoredJob(False, str(exc))
    if result.overrides != tuple(overrides):
        return StoredJob(False, f"{path}: stored for other overrides {_brief(list(result.overrides))}")
    difference = _config_difference(result.config, config)
    return StoredJob(not difference, f"{path}: {difference}" if difference else "")


def task_config(sweep_config: DictConfig, job_dir: Path) -> dict:
    """The config a job will run, as result.json stores it: without its `hydra` node, resolved the
    way Hydra's run_job resolves it (HydraConfig set, the job's output_dir filled in), JSON values."""
    full = copy.deepcopy(sweep_config)
    with read_write(full.hydra.runtime), open_dict(full.hydra.runtime):
        full.hydra.runtime.output_dir = os.path.abspath(job_dir)
    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    hydra_config.set_config(full)
    try:
        task = copy.deepcopy(full)
        with read_write(task), open_dict(task):
            del task["hydra"]
        return json.loads(json.dumps(OmegaConf.to_container(task, resolve=True), default=str))
    finally:
        hydra_config.cfg = before


def job_already_done(job_dir: Path, overrides: Sequence[str], sweep_config: DictConfig) -> bool:
    """The launcher's question before each job, whose composed config (with its `hydra` node) is
    `sweep_config`. A stored result it cannot keep is moved aside to result.rejected.json, with one
    line, so no table mixes it in even if the job fails this time."""
    stored = stored_job(job_dir, overrides, task_config(sweep_config, job_dir))
    if stored.reason:
        os.replace(job_dir / RESULT_FILE, job_dir / REJECTED_FILE)
        warn(f"{stored.reason}; moved to {REJECTED_FILE}, running the job again")
    return stored.done


def count_done(folder: Path, jobs: Sequence[Sequence[str]]) -> int:
    """Jobs with a sound result in folder; a sweep may list the same job twice (workers=0,0). A damaged
    result counts as not done (its job runs again); a newer one raises NewerFile."""
    finished = Counter(r.overrides for r in scan_job_results(folder).results)
    wanted = Counter(task_overrides(job) for job in jobs)
    return sum(min(n, finished[overrides]) for overrides, n in wanted.items())


def _readable(paths: Iterable[Path]) -> Iterable[Tuple[Path, Invocation]]:
    """Each invocation.json that reads back, checked (pipebench.record.stored)."""
    for path in paths:
        try:
            stored = read_stored(path, lambda data: check_fields(data, INVOCATION_FIELDS))
            yield path, parse(Invocation, stored)
        except (DamagedFile, NewerFile) as exc:
            warn(f"{exc}; that folder is not resumed")


def latest_unfinished(records: Iterable[Path], matches: Callable[[Invocation], bool]) -> Optional[InvocationChoice]:
    """Of the invocation.json files given, the latest that `matches`, if its jobs are not all done."""
    found = [(float(record.created), path.parent, record)
             for path, record in _readable(records) if matches(record)]
    if not found:
        return None
    _, folder, record = max(found, key=lambda item: item[0])
    jobs = record.jobs
    try:
        done = count_done(folder, jobs)
    except NewerFile as exc:
        raise NewerFile(f"{exc}, or pass --fresh to start a new folder") from None
    return InvocationChoice(folder, done, len(jobs), resumed=True) if done < len(jobs) else None


def dated(results_dir: Path, tail: str) -> Path:
    """results_dir/<local start time>-tail: a results folder's runs sort by when they started."""
    return Path(results_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{tail}"


def new_folder(folder: Path) -> Path:
    """Create folder, or folder-2, folder-3, ... when that name is taken (two runs started within the
    same second): creation is exclusive, so two runs never share one."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = folder, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1
            candidate = folder.with_name(f"{folder.name}-{n}")


def choose_invocation(results_dir: Path, new_folder_name: Path, swept: Sequence[str], jobs: Sequence[Sequence[str]],
                      fresh: bool) -> InvocationChoice:
    """The latest incomplete invocation of the same sweep, else a new folder, created now (always new with fresh)."""
    latest = None if fresh else latest_unfinished(results_dir.glob(f"*/{INVOCATION_FILE}"),
                                                  lambda record: record.swept == tuple(swept))
    return latest or InvocationChoice(new_folder(new_folder_name), 0, len(jobs), resumed=False)


def record_invocation(folder: Path, swept: Sequence[str], jobs: Sequence[Sequence[str]],
                      command: Sequence[str]) -> None:
    """Write invocation.json (kept as first written when a run resumes the folder)."""
    path = folder / INVOCATION_FILE
    if path.is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, versioned({"command": list(command), "swept": list(swept),
                                       "jobs": [list(job) for job in jobs], "created": time.time()}))


class LinkedFolder(PipebenchError):
    """A folder in a results folder is a symbolic link: a run writing there would write elsewhere."""


def _refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise LinkedFolder(f"{path} is a symbolic link to {os.readlink(path)}: pipebench writes a results "
                           "folder's own folders, never through a link; remove the link (what it points to is "
                           "untouched), or pass --fresh for a new folder")


def ready_for_sweep(folder: Path) -> None:
    """Before a sweep runs in `folder`: refuse it, or any folder in it (`job-N`, `.hydra`), being a
    symbolic link (LinkedFolder), and drop the old name of Hydra's multirun.yaml, which Hydra writes in place."""
    _refuse_link(folder)
    for root, folders, _ in os.walk(folder):  # a linked folder is listed here, never entered
        for name in sorted(folders):
            _refuse_link(Path(root) / name)
    (folder / HYDRA_SWEEP_FILE).unlink(missing_ok=True)


def drop_links(job_dir: Path) -> None:
    """Before a job runs (again) in `job_dir`: remove the folder if it is a symbolic link, and in it
    every symbolic link and every file with another name elsewhere (a hard link), so no writer
    writes through one. Hydra writes the job's .hydra/*.yaml and its log in place; the job's own
    files are rewritten anyway. What a link pointed to, and a file's other name, are untouched."""
    if job_dir.is_symlink():
        job_dir.unlink()
        return
    for root, folders, files in os.walk(job_dir):
        for name in (*folders, *files):
            info = os.lstat(Path(root) / name)
            if stat.S_ISLNK(info.st_mode) or (stat.S_ISREG(info.st_mode) and info.st_nlink > 1):
                (Path(root) / name).unlink()


def abandon_new_folder(folder: Path) -> None:
    """Remove a folder this run created but stopped in before recording its sweep (a full disk, a
    Ctrl-C while it started), so no empty folder is left behind; a folder holding anything more is kept."""
    if (folder / INVOCATION_FILE).exists():
        return
    (folder / LOCK_FILE).unlink(missing_ok=True)
    with suppress(OSError):  # not empty: something else is in it
        folder.rmdir()
