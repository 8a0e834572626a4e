"""An A/B session: two versions of the code under test measured in one session, then compared.

The base ref is checked out into a temporary git worktree. Each side runs every job of the sweep from
its own tree (first on PYTHONPATH, and the working directory), so its configs, transforms and datasets
are the ones measured. Sides alternate (base first in even rounds, head first in odd ones), so drift
and a warm-up edge land on both alike; round K of one side pairs with round K of the other in `compare`.

Where both trees have the round gate (pipebench.measure.round_gate), each side is one
`pipebench run ... rounds=N`, started one side after the other and paced a round at a time, so a
command's fixed costs (imports, the check's builds, the calibration, the report) are paid once a side,
not once a round. A tree without the gate (an older commit) runs each round as a command of its own,
`rounds=1 run.round=K`, and then so does the other side, so both start their rounds alike.
"""
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from pipebench.base.command import results_folder
from pipebench.base.io import folder_safe
from pipebench.measure.round_gate import gate_env, read_number, say_round
from pipebench.record.results import load_job_results
from pipebench.record.resume import dated
from pipebench.regress.compare import Comparison, Run, compare_runs, load_run

# The overrides each side's command gets where it runs one round: that round alone, numbered
# (`run.round=K` follows). The calibration and the CPU reference stay as the config sets them
# (suite=nightly: calibrate=true), so the CPU signal is judged per reference ms, as measured.
ROUND_OVERRIDES = ("rounds=1",)
# A side's command: pipebench's CLI as the side's own tree resolves it.
CLI_MAIN = "import sys; from pipebench.cli.main import main; sys.exit(main())"
# Whether a side's tree has the round gate: a cheap import of it alone.
GATE_PROBE = "import pipebench.measure.round_gate"
# An override that swaps pipebench's launcher, which alone enters the gate, for another (a cluster's).
OTHER_LAUNCHER = "hydra/launcher="
# Fingerprint fields whose values a side's environment sets: a difference is named on one line.
VERSION_FIELDS = ("python", "torch", "torchvision", "numpy", "pillow", "libjpeg_turbo")
# Exit statuses for `git bisect run`: good, bad, and "cannot test this commit".
EXIT_GOOD, EXIT_REGRESSION, EXIT_SKIP = 0, 1, 125
# How long a side's command, told to stop (the session failed or was interrupted), has to end
# its jobs before it is killed.
STOP_GRACE_S = 30


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


@dataclass
class SideFailed(Exception):
    """A side's run exited non-zero in some round: this commit cannot be measured. Not frozen: Python
    sets an exception's __traceback__ and __cause__ as it passes (contextlib's exits included)."""

    side: str
    round: int
    status: int
    tail: str

    def __str__(self) -> str:
        return f"{self.side} side failed in round {self.round} (exit {self.status}): {self.tail}"


@dataclass(frozen=True)
class Session:
    """What an A/B session measured: each side's result folders (one for the side's whole run, or
    one a round where a tree had no round gate) and the comparison."""

    folders: Mapping[str, Tuple[Path, ...]]
    comparison: Comparison
    version_note: Optional[str] = None
    seconds: float = 0.0
    sides: Tuple[Side, ...] = ()


@dataclass(frozen=True)
class Plan:
    """What every command of a session shares: the sweep's overrides, the rounds, where results go
    (the session's folder), the working directory inside each tree and `--config-dir`."""

    overrides: Tuple[str, ...]
    rounds: int
    folder: Path
    cwd_in_tree: Path
    config_dir: Optional[str] = None

    def command(self, side: Side, *extra: str) -> List[str]:
        """`pipebench run` of the sweep for `side`, its results under the session's folder."""
        return [side.python, "-c", CLI_MAIN, "run", "--fresh",
                *(["--config-dir", self.config_dir] if self.config_dir else []), *self.overrides, *extra,
                f"results_dir={(self.folder / side.name).resolve()}"]

    def cwd(self, side: Side) -> Path:
        return side.tree / self.cwd_in_tree


def side_env(tree: Path, other_trees: Sequence[Path], base_env: Mapping[str, str]) -> Dict[str, str]:
    """The environment a side runs in: its tree first on PYTHONPATH, and no entry from the other
    side's tree, so `import pipebench` and the user's modules resolve from this side's code."""
    others = [str(t.resolve()) for t in other_trees]
    kept = [p for p in base_env.get("PYTHONPATH", "").split(os.pathsep)
            if p and not any(os.path.abspath(p).startswith(o) for o in others)]
    return {**base_env, "PYTHONPATH": os.pathsep.join([str(tree), *kept])}


def has_gate(side: Side, cwd: Path, env: Mapping[str, str]) -> bool:
    """Whether the side's code has the round gate (an older commit may not)."""
    return subprocess.run([side.python, "-c", GATE_PROBE], cwd=cwd, env=dict(env), capture_output=True,
                          check=False).returncode == 0


def _tail(stdout: str, stderr: str) -> str:
    return (stderr.strip().splitlines() or stdout.strip().splitlines() or ["no output"])[-1]


def run_side(side: Side, plan: Plan, round_num: int, env: Mapping[str, str]) -> Path:
    """One round of the sweep for one side, a command of its own; returns the results folder it named."""
    proc = subprocess.run(plan.command(side, *ROUND_OVERRIDES, f"run.round={round_num}"), cwd=plan.cwd(side),
                          env=dict(env), capture_output=True, text=True, check=False)
    folder = results_folder(proc.stdout.splitlines())
    if proc.returncode != 0 or folder is None:
        raise SideFailed(side.name, round_num, proc.returncode, _tail(proc.stdout, proc.stderr))
    return folder


class GatedRun:
    """One side's `pipebench run` of every round, paced through its round gate: started, told to go
    a round at a time, and waited for until it is ready for the next (or has ended). Its output
    goes to temporary files, read once it has ended."""

    def __init__(self, side: Side, plan: Plan, env: Mapping[str, str]) -> None:
        self.side = side
        go_read, self.go_fd = os.pipe()
        self.ready_fd, ready_write = os.pipe()
        self.stdout = tempfile.TemporaryFile("w+")
        self.stderr = tempfile.TemporaryFile("w+")
        try:
            self.proc = subprocess.Popen(plan.command(side, f"rounds={plan.rounds}"), cwd=plan.cwd(side),
                                         env=gate_env(env, go_read, ready_write), stdout=self.stdout,
                                         stderr=self.stderr, pass_fds=(go_read, ready_write), text=True)
        except BaseException:
            self._close_files()
            raise
        finally:
            os.close(go_read)
            os.close(ready_write)

    def ready_for(self, round_num: int) -> None:
        """Wait until the run is ready for `round_num`; SideFailed if it ended first."""
        if read_number(self.ready_fd) != round_num:
            raise self._failed(max(round_num - 1, 0))

    def go(self, round_num: int) -> None:
        try:
            say_round(self.go_fd, round_num)
        except BrokenPipeError:  # it ended while it waited
            raise self._failed(round_num) from None

    def finish(self, round_num: int) -> Path:
        """Wait for the run to end after its last round, `round_num`; the results folder it named."""
        if read_number(self.ready_fd) is not None:
            raise self._failed(round_num)
        self.proc.wait()
        folder = results_folder(self._read(self.stdout).splitlines())
        if self.proc.returncode != 0 or folder is None:
            raise self._failed(round_num)
        return folder

    def _failed(self, round_num: int) -> SideFailed:
        if self.proc.poll() is None:  # alive but off the protocol: not waited for
            self.proc.terminate()
        self.proc.wait()
        return SideFailed(self.side.name, round_num, self.proc.returncode,
                          _tail(self._read(self.stdout), self._read(self.stderr)))

    @staticmethod
    def _read(file) -> str:
        file.seek(0)
        return file.read()

    def _close_files(self) -> None:
        for fd in (self.go_fd, self.ready_fd):
            os.close(fd)
        self.stdout.close()
        self.stderr.close()

    def close(self) -> None:
        """End the run if it still runs (its gate closed, then SIGTERM, which ends its jobs), and
        release its pipes and files."""
        self._close_files()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _alternating(sides: Tuple[Side, Side], rounds: int, progress) -> Iterator[Tuple[int, Side]]:
    """(round, side) in session order, base first in even rounds; each said with its time once done."""
    for k in range(rounds):
        for side in sides if k % 2 == 0 else sides[::-1]:
            t0 = time.monotonic()
            yield k, side
            progress(f"[round {k + 1}/{rounds}] {side.describe()}: {time.monotonic() - t0:.0f} s", flush=True)


def _gated_rounds(sides: Tuple[Side, Side], plan: Plan, envs: Mapping[str, Mapping[str, str]],
                  progress) -> Dict[str, List[Path]]:
    """Each side one paced run: started one after the other (a side's start-up, its calibration
    included, never runs beside the other's), then a round at a time, alternating."""
    runs: Dict[str, GatedRun] = {}
    made: Dict[str, List[Path]] = {}
    try:
        for side in sides:
            runs[side.name] = GatedRun(side, plan, envs[side.name])
            runs[side.name].ready_for(0)
        for k, side in _alternating(sides, plan.rounds, progress):
            run = runs[side.name]
            run.go(k)
            if k + 1 < plan.rounds:
                run.ready_for(k + 1)
            else:
                made[side.name] = [run.finish(k)]
    finally:
        for run in runs.values():
            run.close()
    return made


def _rounds_apart(sides: Tuple[Side, Side], plan: Plan, envs: Mapping[str, Mapping[str, str]],
                  progress) -> Dict[str, List[Path]]:
    """Each round of each side a command of its own, alternating (a tree without the round gate)."""
    made: Dict[str, List[Path]] = {side.name: [] for side in sides}
    for k, side in _alternating(sides, plan.rounds, progress):
        made[side.name].append(run_side(side, plan, k, envs[side.name]))
    return made


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
    return dated(results_dir / "ab", folder_safe(f"{base.commit[:10]}-vs-{head.commit[:10]}"))


def side_run(folders: Sequence[Path]) -> Run:
    """A side's rounds as one run, without its calibration: both sides share the machine and the
    moment, which is what the calibration stands for, so the session compares raw figures (and
    CPU time per the CPU reference, where every round carries it)."""
    return replace(load_run(*map(str, folders)), calibration=None)


def paced(sides: Tuple[Side, Side], plan: Plan, envs: Mapping[str, Mapping[str, str]]) -> bool:
    """Whether the session runs each side as one paced run: both trees have the round gate, and the
    sweep keeps pipebench's launcher, the one that enters it (a cluster's launcher never would)."""
    if any(override.lstrip("+~").startswith(OTHER_LAUNCHER) for override in plan.overrides):
        return False
    return all(has_gate(side, plan.cwd(side), envs[side.name]) for side in sides)


def run_session(base: Side, head: Side, plan: Plan, threshold: float, progress=print) -> Session:
    """Every round, both sides, alternating; then the paired comparison. SideFailed if a side fails."""
    start = time.monotonic()
    envs = {base.name: side_env(base.tree, [head.tree], os.environ),
            head.name: side_env(head.tree, [base.tree], os.environ)}
    if paced((base, head), plan, envs):
        progress(f"each side one `pipebench run` of {plan.rounds} rounds, started once, paced round by round",
                 flush=True)
        folders = _gated_rounds((base, head), plan, envs, progress)
    else:
        progress("each round of each side a `pipebench run` of its own: a tree has no round gate "
                 "(pipebench/measure/round_gate.py), or the sweep names another launcher", flush=True)
        folders = _rounds_apart((base, head), plan, envs, progress)
    comparison = compare_runs(side_run(folders[base.name]), side_run(folders[head.name]), threshold,
                              allow_mismatch=True, paired=True)
    note = version_note(versions(folders[base.name][0]), versions(folders[head.name][0]))
    return Session({k: tuple(v) for k, v in folders.items()}, comparison, note, time.monotonic() - start,
                   (base, head))
