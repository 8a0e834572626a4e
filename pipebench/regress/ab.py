"""An A/B session: two versions of the code under test measured in one session, then compared.

The base ref is checked out into a temporary git worktree. Round by round, each side runs every
job of the sweep (`pipebench run ... rounds=1 run.round=K`, each job its own fresh process), with
its own tree first on PYTHONPATH and as the working directory, so its configs, transforms and
datasets are the ones measured. The order alternates (base first in even rounds, head first in
odd ones), so drift and a warm-up advantage land on both sides alike. Round K of one side pairs
with round K of the other in `compare`.
"""

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.base.io import folder_safe
from pipebench.record.results import load_job_results
from pipebench.regress.compare import Comparison, compare_runs, load_run

# The per-round overrides each side's `pipebench run` gets: one round of the sweep, numbered,
# no calibration (both sides share the machine and the moment, which is what calibration stood for).
ROUND_OVERRIDES = ("rounds=1", "calibrate=false")
# Fingerprint fields whose values a side's environment sets: a difference is named on one line.
VERSION_FIELDS = ("python", "torch", "torchvision", "numpy", "pillow", "libjpeg_turbo")
# The last line of `pipebench run` names its folder.
RESULTS_PREFIX = "results: "
SIDES = ("base", "head")
# Exit statuses for `git bisect run`: good, bad, and "cannot test this commit".
EXIT_GOOD, EXIT_REGRESSION, EXIT_SKIP = 0, 1, 125


@dataclass(frozen=True)
class Side:
    """One version under test: a name, the tree it runs from, its commit and the Python that runs it."""

    name: str
    tree: Path
    commit: str
    python: str
    dirty: bool = False

    def describe(self) -> str:
        return f"{self.name} {self.commit[:12]}{' (dirty work tree)' if self.dirty else ''}"


@dataclass(frozen=True)
class SideFailed(Exception):
    """A side's run exited non-zero in some round: this commit cannot be measured."""

    side: str
    round: int
    status: int
    tail: str

    def __str__(self) -> str:
        return f"{self.side} side failed in round {self.round} (exit {self.status}): {self.tail}"


@dataclass(frozen=True)
class Session:
    """What an A/B session measured: each side's result folders (one a round) and the comparison."""

    folder: Path
    folders: Mapping[str, Tuple[Path, ...]]
    comparison: Comparison
    version_note: Optional[str] = None
    seconds: float = 0.0
    sides: Tuple[Side, ...] = field(default=())


def side_env(tree: Path, other_trees: Sequence[Path], base_env: Mapping[str, str]) -> Dict[str, str]:
    """The environment a side runs in: its tree first on PYTHONPATH, and no entry from the other
    side's tree, so `import pipebench` and the user's modules resolve from this side's code."""
    others = [str(t.resolve()) for t in other_trees]
    kept = [p for p in base_env.get("PYTHONPATH", "").split(os.pathsep)
            if p and not any(os.path.abspath(p).startswith(o) for o in others)]
    return {**base_env, "PYTHONPATH": os.pathsep.join([str(tree), *kept])}


def run_side(side: Side, overrides: Sequence[str], round_num: int, results_dir: Path, cwd_in_tree: Path,
             env: Mapping[str, str], config_dir: Optional[str]) -> Path:
    """One round of the sweep for one side; returns the results folder its `pipebench run` named."""
    command = [side.python, "-c", "import sys; from pipebench.cli.main import main; sys.exit(main())", "run",
               "--fresh", *(["--config-dir", config_dir] if config_dir else []), *overrides, *ROUND_OVERRIDES,
               f"run.round={round_num}", f"results_dir={results_dir}"]
    proc = subprocess.run(command, cwd=side.tree / cwd_in_tree, env=dict(env), capture_output=True, text=True,
                          check=False)
    lines = proc.stdout.strip().splitlines()
    folder = next((line[len(RESULTS_PREFIX):] for line in reversed(lines) if line.startswith(RESULTS_PREFIX)), None)
    if proc.returncode != 0 or folder is None:
        tail = (proc.stderr.strip().splitlines() or lines or ["no output"])[-1]
        raise SideFailed(side.name, round_num, proc.returncode, tail)
    return Path(folder)


def versions(folder: Path) -> Dict[str, object]:
    """The VERSION_FIELDS of the first job of a results folder."""
    results = load_job_results(folder)
    fingerprint = results[0].fingerprint if results else {}
    return {key: fingerprint.get(key) for key in VERSION_FIELDS}


def version_note(base: Mapping[str, object], head: Mapping[str, object]) -> Optional[str]:
    """One line naming every version that differs between the sides, or None."""
    moved = [f"{k} {base.get(k)} -> {head.get(k)}" for k in VERSION_FIELDS if base.get(k) != head.get(k)]
    return f"versions differ between the sides: {', '.join(moved)}" if moved else None


def session_folder(results_dir: Path, base: Side, head: Side) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return results_dir / "ab" / folder_safe(f"{stamp}-{base.commit[:10]}-vs-{head.commit[:10]}")


def run_session(base: Side, head: Side, overrides: Sequence[str], rounds: int, folder: Path, cwd_in_tree: Path,
                threshold: float, config_dir: Optional[str] = None, progress=print) -> Session:
    """Every round, both sides, alternating; then the paired comparison. SideFailed if a side fails."""
    start = time.monotonic()
    envs = {base.name: side_env(base.tree, [head.tree], os.environ),
            head.name: side_env(head.tree, [base.tree], os.environ)}
    folders: Dict[str, List[Path]] = {base.name: [], head.name: []}
    for k in range(rounds):
        for side in ((base, head) if k % 2 == 0 else (head, base)):
            t0 = time.monotonic()
            made = run_side(side, overrides, k, (folder / side.name).resolve(), cwd_in_tree, envs[side.name],
                            config_dir)
            folders[side.name].append(made)
            progress(f"[round {k + 1}/{rounds}] {side.describe()}: {time.monotonic() - t0:.0f} s", flush=True)
    comparison = compare_runs(load_run(*map(str, folders[base.name])), load_run(*map(str, folders[head.name])),
                              threshold, allow_mismatch=True, paired=True)
    note = version_note(versions(folders[base.name][0]), versions(folders[head.name][0]))
    return Session(folder, {k: tuple(v) for k, v in folders.items()}, comparison, note,
                   time.monotonic() - start, (base, head))
