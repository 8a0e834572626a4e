"""A tune's plan in its results folder (`tune.json`), so the same command resumes it (docs/tune.md's
Resume): the command, the chains and the race's points, written as they are decided, are read back
instead of decided again (explore's checks, a budget cut that depends on the time left).
"""

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from pipebench.base.errors import warn
from pipebench.base.io import write_json_atomic
from pipebench.base.typed_json import parse
from pipebench.record.results import RESULT_FILE

__all__ = ["STATE_FILE", "TUNE_MD", "TuneState", "finished_trials", "read_state", "unfinished_folder", "update_state"]

STATE_FILE = "tune.json"
# tune.md, written last (tune.files): its presence says a tune ended. Here, not in files, so reading
# tune.json imports no matplotlib.
TUNE_MD = "tune.md"


@dataclass(frozen=True)
class TuneState:
    """The plan as tune.json keeps it, each part None until the tune records it: when it began, its
    command, its chains (ChainSet.record) and the points the race starts with (each Point's fields)."""

    created: float = 0.0
    command: Optional[Tuple[str, ...]] = None
    chains: Optional[Mapping[str, Mapping[str, object]]] = None
    entrants: Optional[Tuple[Mapping[str, Any], ...]] = None


def read_state(folder: Path) -> Optional[TuneState]:
    """The folder's plan; None where it has none, or one that does not read (with a warning)."""
    stored = _stored(folder)
    return None if stored is None else parse(TuneState, stored)


def _stored(folder: Path) -> Optional[Dict[str, Any]]:
    """tune.json's mapping, every key kept, for update_state to add to."""
    path = folder / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        warn(f"{path} does not read ({exc}); that tune is not resumed")
        return None
    return state if isinstance(state, dict) else None


def update_state(folder: Path, **fields: Any) -> TuneState:
    """The plan with `fields` added, written at once (atomically); returns it."""
    state = {**(_stored(folder) or {"created": time.time()}), **fields}
    write_json_atomic(folder / STATE_FILE, state)
    return parse(TuneState, state)


def unfinished_folder(results_dir: Path, pattern: str, command: Sequence[str]) -> Optional[Path]:
    """The latest folder under `results_dir` matching `pattern` whose plan records `command` and that
    has no TUNE_MD (a tune that ended wrote it); None when there is none."""
    found = []
    for path in results_dir.glob(f"{pattern}/{STATE_FILE}"):
        state = read_state(path.parent)
        if state is not None and state.command == tuple(command) and not (path.parent / TUNE_MD).exists():
            found.append((float(state.created), path.parent))
    return max(found)[1] if found else None


def finished_trials(folder: Path) -> int:
    """Jobs with a result in the tune's stage folders (probe/, race-N/, verify/)."""
    return sum(1 for _ in folder.glob(f"*/job-*/{RESULT_FILE}"))
