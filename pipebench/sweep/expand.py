"""A command's overrides as a sweep's jobs: the search path, the rounds and the suite's params
folded in, each job expanded the way Hydra's BasicSweeper expands it, and the folder label.

`pipebench run transform=a,b workers=0,4` needs no `--multirun`: the overrides are parsed with
Hydra's own parser, so the jobs checked up front are exactly the jobs Hydra runs.
"""

import hashlib
import os
import re
import sys
from pathlib import Path
from typing import List, Optional, Sequence

# BasicSweeper's own expansion, so the jobs checked up front are exactly the jobs Hydra runs.
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from pipebench.base.errors import ConfigError
from pipebench.base.io import folder_safe
from pipebench.config.compose import one_line, sweep_settings
from pipebench.record.jobs import override_key

__all__ = ["MAX_LABEL_CHARS", "expand_sweep", "import_from_cwd", "label", "quote", "refuse_hydra_dirs",
           "search_path", "sweep_overrides"]

# Longest label in a results folder name; the full overrides are in every result.json.
MAX_LABEL_CHARS = 60
# A label cut to fit ends with this many hex digits of the whole label's digest, so two sweeps that
# differ only past the cut get different names.
LABEL_DIGEST_CHARS = 8
# Where a label too long to keep whole may be cut: between overrides, a key and its value, the words
# of a name or the values of a list (a "." may sit inside a number).
WORD_BOUNDARY = re.compile(r"[-_+]")
# The rounds sweep goes first: BasicSweeper varies its first list slowest, so every job runs
# once before any job runs again, and drift hits every job alike.
ROUND_SWEEP = "run.round=range(0,{rounds})"
# Where Hydra puts a sweep and its jobs: pipebench sets them (a folder a run under results_dir, its
# jobs job-N, found again on resume), so a user's value would be overridden in silence.
HYDRA_DIR_KEYS = ("hydra.sweep.dir", "hydra.sweep.subdir")


def label(overrides: Sequence[str]) -> str:
    """A folder-safe label from the overrides, e.g. `transform-yuv_mask_workers-0+4+8`."""
    parts = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.startswith(("hydra.", "results_dir")):
            continue
        parts.append(folder_safe(f"{key.split('.')[-1].lstrip('+~')}-{value.replace(',', '+')}"))
    whole = "_".join(parts)
    return _cut_label(whole) if len(whole) > MAX_LABEL_CHARS else whole or "default"


def _cut_label(whole: str) -> str:
    """`whole` cut to fit MAX_LABEL_CHARS at its last word boundary, never inside a word or a number,
    then the whole label's digest, so names cut alike stay apart."""
    room = MAX_LABEL_CHARS - LABEL_DIGEST_CHARS - 1
    cuts = [m.start() for m in WORD_BOUNDARY.finditer(whole[:room + 1]) if m.start() > 0]
    kept = whole[:max(cuts)] if cuts else whole[:room]
    return f"{kept}_{hashlib.sha1(whole.encode()).hexdigest()[:LABEL_DIGEST_CHARS]}"


def quote(value: str) -> str:
    """`value` as a quoted string of Hydra's override grammar."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def expand_sweep(overrides: Sequence[str]) -> List[List[str]]:
    """Every job's overrides, expanded the way Hydra's BasicSweeper does (comma lists, range, choice)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        return BasicSweeper.split_arguments(parsed, None)[0]
    except HydraException as exc:
        raise ConfigError(one_line(exc)) from exc


def sweep_overrides(overrides: Sequence[str]) -> List[str]:
    """The whole sweep as overrides: the rounds sweep, the config's sweeper params, then the user's. The
    order mirrors BasicSweeper (params before the command line; a later override of a key replaces its
    values in place), so `expand_sweep` of the result is exactly the jobs that will run."""
    settings = sweep_settings(expand_sweep(overrides)[0])
    rounds = [ROUND_SWEEP.format(rounds=settings.rounds)] if settings.rounds > 1 else []
    return [*rounds, *settings.params, *overrides]


def refuse_hydra_dirs(overrides: Sequence[str]) -> None:
    """A ConfigError naming results_dir for an override of where Hydra puts the sweep or its jobs."""
    for item in overrides:
        if override_key(item) in HYDRA_DIR_KEYS:
            raise ConfigError(f"{override_key(item)} is set by pipebench (each run gets a folder of its own "
                              "under results_dir, its jobs in job-N, so the same command resumes it); "
                              "pass results_dir=DIR to choose where results go")


def import_from_cwd() -> None:
    """User modules named by `_target_` resolve from the working directory, as with `python -m`."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def search_path(config_dir: Optional[str]) -> List[str]:
    """A `hydra.searchpath` override for the user's --config-dir, or none. Nothing pipebench stored
    ever goes on the search path: explore's variants reach Hydra through its ConfigStore."""
    if config_dir is None:
        return []
    if not Path(config_dir).is_dir():
        raise ConfigError(f"--config-dir {config_dir}: no such directory")
    return [f"hydra.searchpath=[{quote('file://' + str(Path(config_dir).resolve()))}]"]
