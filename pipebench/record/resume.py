"""Resume an interrupted sweep: invocation.json records what a `pipebench run` swept.

Re-running the identical command (same overrides, same results_dir) finds the latest invocation
folder that recorded the same sweep; if it is incomplete, the run reuses it and the launcher
skips every job whose folder already holds a result.json with the same overrides. A finished
invocation, or `--fresh`, starts a new folder.
"""

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence, Tuple

from pipebench.base.io import write_json_atomic
from pipebench.record.results import RESULT_FILE, load_job_results

INVOCATION_FILE = "invocation.json"
# Hydra keeps `hydra.*` overrides out of a job's task overrides (result.json "overrides").
HYDRA_PREFIX = "hydra."


@dataclass(frozen=True)
class InvocationChoice:
    """Where a run writes, and how many of its jobs an earlier, interrupted run already finished."""

    folder: Path
    done: int
    total: int
    resumed: bool


def task_overrides(job: Sequence[str]) -> Tuple[str, ...]:
    """A job's overrides as its result.json records them."""
    return tuple(o for o in job if not o.startswith(HYDRA_PREFIX))


def same_job(result: Mapping[str, object], overrides: Sequence[str]) -> bool:
    return tuple(result.get("overrides") or ()) == tuple(overrides)


def job_already_done(job_dir: Path, overrides: Sequence[str]) -> bool:
    """True when job_dir holds a readable result.json of a job with exactly these overrides."""
    try:
        return same_job(json.loads((job_dir / RESULT_FILE).read_text()), overrides)
    except (OSError, ValueError):
        return False


def count_done(folder: Path, jobs: Sequence[Sequence[str]]) -> int:
    """Jobs with a finished result in folder; a sweep may list the same job twice (workers=0,0)."""
    finished = Counter(tuple(r.get("overrides") or ()) for r in load_job_results(folder))
    wanted = Counter(task_overrides(job) for job in jobs)
    return sum(min(n, finished[overrides]) for overrides, n in wanted.items())


def _read(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _unused(folder: Path) -> Path:
    """folder, or folder-2, folder-3, ... when two runs start within the same second."""
    candidate, n = folder, 1
    while candidate.exists():
        n += 1
        candidate = folder.with_name(f"{folder.name}-{n}")
    return candidate


def latest_unfinished(records: Iterable[Path], matches: Callable[[Mapping[str, object]], bool]
                      ) -> Optional[InvocationChoice]:
    """Of the invocation.json files given, the latest that `matches`, if its jobs are not all done."""
    found = [(float(record.get("created", 0.0)), path.parent, record)
             for path in records for record in [_read(path)] if record is not None and matches(record)]
    if not found:
        return None
    _, folder, record = max(found, key=lambda item: item[0])
    jobs = record.get("jobs") or []
    done = count_done(folder, jobs)
    return InvocationChoice(folder, done, len(jobs), resumed=True) if done < len(jobs) else None


def choose_invocation(results_dir: Path, new_folder: Path, swept: Sequence[str], jobs: Sequence[Sequence[str]],
                      fresh: bool) -> InvocationChoice:
    """The latest incomplete invocation of the same sweep, else a new folder (always new with fresh)."""
    latest = None if fresh else latest_unfinished(results_dir.glob(f"*/{INVOCATION_FILE}"),
                                                  lambda record: record.get("swept") == list(swept))
    return latest or InvocationChoice(_unused(new_folder), 0, len(jobs), resumed=False)


def record_invocation(folder: Path, swept: Sequence[str], jobs: Sequence[Sequence[str]],
                      command: Sequence[str]) -> None:
    """Write invocation.json (kept as first written when a run resumes the folder)."""
    path = folder / INVOCATION_FILE
    if path.is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"command": list(command), "swept": list(swept),
                             "jobs": [list(job) for job in jobs], "created": time.time()})
