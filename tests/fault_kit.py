"""Fault cases against the real `pipebench` command: start a sweep, wait for an event, hurt it, and
measure what came of it (the exit status, the one line, the rows kept, the processes left).

Every wait is for an event (a marker file a Fault transform writes from inside the job, a job
process appearing, a file the CLI writes), never for a guessed time, so a loaded machine makes
a case slower but not different. test_fault_cases.py asserts each case once;
benchmarks/fault_matrix.py runs each many times and tabulates the rates.
"""

import csv
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import fault_transforms
import numpy as np
import psutil
from conftest import PIPEBENCH_SCRIPT
from PIL import Image

from pipebench.record.resume import INVOCATION_FILE

# The target: every process a run started is gone this long after `pipebench` ends.
ORPHAN_DEADLINE_S = 2.0
# The longest one case may take: CLI start-up, two short jobs and the fault, on a loaded 2-core machine.
CASE_TIMEOUT_S = 240.0
# How often a case looks for the event it waits on.
POLL_S = 0.02
# Set in the environment of `pipebench`, so every process it starts inherits it: orphans are
# found by it, wherever they were reparented.
RUN_MARK_ENV = "PIPEBENCH_FAULT_RUN"
MARKERS = "markers"
CONF = "conf"
FAULT_CHAIN = "fault"
RESULTS = "out"
# Where a case's own input (an image folder) is built; its files are checksummed before and after.
INPUTS = "inputs"
# Small, fast jobs: a decode-free dataset, three measured steps, no profile, no consumer time.
FAST_JOB = ("dataset=random_tensors", "dataset.shape=[3,32,32]", "dataset.length=512", "run=quick",
            "run.progress=false", "run.warmup_steps=0", "run.min_time_s=0", "run.steps=3", "run.profile_steps=0",
            "loader.batch_size=8", "consumer=none", f"results_dir={RESULTS}")
JOB_PROCESS_MODULE = "pipebench.measure.job_process"
# The spinning case waits this long for its watchdog: the spin is the job's first step (workers=0,
# no warm-up), so no honest step comes near it.
SPIN_TIMEOUT_S = 1


def install_faults(project: Path) -> Path:
    """Put fault_transforms.py in `project` and arm it; returns the marker folder."""
    shutil.copy(fault_transforms.__file__, project / "fault_transforms.py")
    markers = project / MARKERS
    markers.mkdir(exist_ok=True)
    (markers / fault_transforms.ARMED).touch()
    return markers


def fault_node(markers: Path, action: str, when: int) -> str:
    """A chain entry (YAML) that runs `action` in the job with workers == `when`."""
    return (f"  - _target_: fault_transforms.Fault\n    marker_dir: {markers}\n    action: {action}\n"
            f"    key: ${{workers}}\n    when: {when}\n")


def markers_written(markers: Path) -> List[int]:
    """Pids of the processes that are inside a Fault now."""
    return sorted(int(p.name) for p in markers.iterdir() if p.name.isdigit())


def marked_processes(mark: str) -> List[psutil.Process]:
    """Live processes (zombies are dead) carrying this run's mark in their environment."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(RUN_MARK_ENV) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


class CaseTimeout(AssertionError):
    """The event a case waited on never came."""


def sigint_at_default() -> None:
    """In the child before exec: SIGINT back to SIG_DFL, so Python there installs its KeyboardInterrupt
    handler. A shell that starts pytest in the background hands SIGINT down ignored, and an ignored
    signal stays ignored across exec: Ctrl-C would never reach pipebench."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_pipebench(args: Sequence[str], cwd: Path, prefix: Sequence[str] = (), **popen) -> subprocess.Popen:
    """`pipebench ARGS` (after `prefix`, e.g. taskset) in a session of its own, so a signal sent to
    its group reaches it and what it starts as a terminal's Ctrl-C would, with SIGINT at its default."""
    return subprocess.Popen([*prefix, str(PIPEBENCH_SCRIPT), *args], cwd=cwd, start_new_session=True,
                            preexec_fn=sigint_at_default, **popen)


class Run:
    """One `pipebench run` in its own session, its output in files, every process it starts marked."""

    def __init__(self, project: Path, args: Tuple[str, ...]) -> None:
        self.project = project
        self.mark = uuid.uuid4().hex
        self.started = time.monotonic()
        self.stdout = project / f"stdout-{self.mark}.txt"
        self.stderr = project / f"stderr-{self.mark}.txt"
        with self.stdout.open("w") as out, self.stderr.open("w") as err:
            self.proc = start_pipebench(["run", *args], project, stdout=out, stderr=err,
                                        env={**os.environ, RUN_MARK_ENV: self.mark})

    def wait_for(self, ready: Callable[[], object], what: str) -> object:
        """Poll until `ready()` is true; fail if pipebench ends first or the case's time runs out."""
        while time.monotonic() - self.started < CASE_TIMEOUT_S:
            value = ready()
            if value:
                return value
            if self.proc.poll() is not None:
                raise CaseTimeout(f"pipebench ended (status {self.proc.returncode}) before {what}")
            time.sleep(POLL_S)
        raise CaseTimeout(f"no {what} within {CASE_TIMEOUT_S:g} s")

    def job_process(self) -> Optional[psutil.Process]:
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.NoSuchProcess:
            return None
        return next((c for c in children if JOB_PROCESS_MODULE in " ".join(c.cmdline())), None)

    def finish(self) -> Tuple[int, int]:
        """Wait for pipebench, then ORPHAN_DEADLINE_S for its processes; (exit status, processes left)."""
        status = self.proc.wait(timeout=max(1.0, CASE_TIMEOUT_S - (time.monotonic() - self.started)))
        deadline = time.monotonic() + ORPHAN_DEADLINE_S
        while marked_processes(self.mark) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return status, len(marked_processes(self.mark))

    def clean_up(self) -> None:
        """Kill whatever is left, so a failed case leaves nothing behind."""
        for proc in [*marked_processes(self.mark)]:
            proc.kill()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


@dataclass(frozen=True)
class Outcome:
    status: int
    # Exactly one line of stderr is the case's line (none for a SIGKILLed pipebench), no other
    # error line, and no traceback.
    clean_line: bool
    rows: int
    orphans: int
    seconds: float
    stderr: str
    # stdout's last line names the results folder, as after any sweep that started measuring.
    results_line: bool
    # Every entry of the case's input folder is as it was (content, link targets, kinds).
    inputs_intact: bool = True


@dataclass(frozen=True)
class FaultCase:
    """One way to hurt a sweep, and what must come of it."""

    name: str
    overrides: Tuple[str, ...]
    # What the case does to the running sweep; None: nothing, the config alone is the fault.
    hurt: Optional[Callable[[Run, Path], None]]
    status: int
    # A regex for the one line on stderr; None: pipebench cannot say anything (it was SIGKILLed).
    line: Optional[str]
    rows: int
    # The fault transform's action and the `workers` value of the job it acts in, if any.
    fault: Optional[Tuple[str, int]] = None
    # pipebench says where the results are, last: it stopped on its own, after measuring began.
    results_line: bool = False
    # Builds the case's input in the folder it is given and returns the dataset overrides that
    # point the job at it, in place of FAST_JOB's.
    inputs: Optional[Callable[[Path], Tuple[str, ...]]] = None


def _rows(project: Path) -> int:
    return sum(len(list(csv.DictReader(p.open()))) for p in (project / RESULTS).glob("*/summary.csv"))


def _clean_line(stderr: str, line: Optional[str]) -> bool:
    if "Traceback" in stderr:
        return False
    errors = re.findall(r"^pipebench: error:.*$", stderr, re.M)
    if line is None:
        return not errors
    matched = re.findall(line, stderr, re.M)
    return len(matched) == 1 and all(re.match(line, e) for e in errors)


def _entries(folder: Path) -> dict:
    """Each entry under `folder`, links not followed: a regular file's digest, a link's target, or
    another kind's file type (a FIFO is never opened)."""
    found = {}
    for parent, folders, files in os.walk(folder):
        for name in folders + files:
            path = Path(parent, name)
            mode = path.lstat().st_mode
            found[str(path.relative_to(folder))] = (
                hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(mode)
                else os.readlink(path) if stat.S_ISLNK(mode) else stat.S_IFMT(mode))
    return found


def run_case(case: FaultCase, project: Path) -> Outcome:
    """Run `case` once in `project` (an empty folder) and measure the outcome."""
    markers = install_faults(project)
    args, job = list(case.overrides), FAST_JOB
    inputs = project / INPUTS
    inputs.mkdir()
    if case.inputs is not None:
        args += case.inputs(inputs)
        job = tuple(arg for arg in FAST_JOB if not arg.startswith("dataset"))
    before = _entries(inputs)
    if case.fault is not None:
        chain = project / CONF / "transform"
        chain.mkdir(parents=True, exist_ok=True)
        (chain / f"{FAULT_CHAIN}.yaml").write_text("per_sample:\n" + fault_node(markers, *case.fault))
        args = ["--config-dir", CONF, f"transform={FAULT_CHAIN}", *args]
    run = Run(project, (*args, *job))
    try:
        if case.hurt is not None:
            case.hurt(run, markers)
        status, orphans = run.finish()
    finally:
        run.clean_up()
    stderr = run.stderr.read_text()
    last = (run.stdout.read_text().strip().splitlines() or [""])[-1]
    return Outcome(status, _clean_line(stderr, case.line), _rows(project), orphans,
                   time.monotonic() - run.started, stderr, last.startswith("results: "), _entries(inputs) == before)


# --- what a case does to the running sweep --------------------------------------------------


def signal_pipebench(sig: int, group: bool, workers: int) -> Callable[[Run, Path], None]:
    """Once `workers` processes are inside the Fault, send `sig` to pipebench (to its whole process
    group when `group`, as a terminal's Ctrl-C does)."""

    def hurt(run: Run, markers: Path) -> None:
        run.wait_for(lambda: len(markers_written(markers)) >= workers, f"{workers} processes inside the fault")
        (os.killpg if group else os.kill)(run.proc.pid, sig)

    return hurt


def kill_marked(run: Run, markers: Path) -> None:
    """SIGKILL the process inside the Fault (the job process at workers=0, else a worker)."""
    pid = run.wait_for(lambda: markers_written(markers), "a process inside the fault")[0]
    os.kill(pid, signal.SIGKILL)


def interrupt_at_command_start(run: Run, markers: Path) -> None:
    """Ctrl-C the moment the first job's process exists: `run` starts it ahead, before its own
    imports, so the command is importing too, and the process has no job to run yet."""
    run.wait_for(run.job_process, "a job process")
    os.killpg(run.proc.pid, signal.SIGINT)


def interrupt_at_job_start(run: Run, markers: Path) -> None:
    """Ctrl-C the moment the launcher names the first job, as it hands it to its process (which
    is unpickling it, or building its pipeline)."""
    run.wait_for(lambda: "[job 1/" in run.stdout.read_text(), "the first job's line")
    os.killpg(run.proc.pid, signal.SIGINT)


def interrupt_at_hydra_start(run: Run, markers: Path) -> None:
    """Ctrl-C once the sweep's folder is recorded, while pipebench starts Hydra."""
    run.wait_for(lambda: list((run.project / RESULTS).glob(f"*/{INVOCATION_FILE}")), "the sweep's folder")
    os.killpg(run.proc.pid, signal.SIGINT)


TWO_JOBS = ("workers=0,2",)
INTERRUPTED = r"^pipebench: interrupted"
# The loader's wait for a batch, short: the hung-sample cases end on it.
HUNG_TIMEOUT_S = 1


def hung_sample(backend: str) -> FaultCase:
    """A sample that never ends in the one worker (a process, or a thread that cannot be stopped):
    every backend ends the job in DataLoader's "timed out" line, and its job process exits."""
    what = "DataLoader" if backend == "dataloader" else backend
    return FaultCase(f"hung sample under loader.backend={backend}",
                     ("workers=1", f"loader.backend={backend}", f"loader.timeout_s={HUNG_TIMEOUT_S}"), None, 2,
                     rf"^pipebench: error: {what} timed out after {HUNG_TIMEOUT_S:.1f} seconds "
                     rf"\(loader.timeout_s={HUNG_TIMEOUT_S}[;)]", rows=0, fault=("sleep", 1), results_line=True)


def image_folder(*odd: Callable[[Path], None]) -> Callable[[Path], Tuple[str, ...]]:
    """The issue's folder, 8 small JPEGs in two class folders, with each of `odd` done to it; the
    overrides measure it with a one-step chain."""

    def build(inputs: Path) -> Tuple[str, ...]:
        rng = np.random.default_rng(0)
        for label in ("a", "b"):
            (inputs / label).mkdir()
            for k in range(4):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(inputs / label / f"{k}.jpg")
        for change in odd:
            change(inputs)
        return ("dataset=image_folder", f"dataset.path={inputs}",
                f"transform.per_sample=[{{_target_: {fault_transforms.__name__}.ToArray}}]")

    return build


def loop_links(inputs: Path) -> None:
    """`loop -> ..` in both class folders: each image once a level, exponentially, before."""
    for label in ("a", "b"):
        os.symlink("..", inputs / label / "loop")


def endless_files(inputs: Path) -> None:
    """A FIFO with no writer and a link to /dev/zero, named like images: the warm-up hung on them."""
    os.mkfifo(inputs / "a" / "pipe.jpg")
    os.symlink("/dev/zero", inputs / "b" / "zero.jpg")


IMAGE_FOLDER_LINE = r"^pipebench: image_folder: \S+: skipped "


CASES = (
    FaultCase("SIGINT to pipebench's group mid-job", TWO_JOBS, signal_pipebench(signal.SIGINT, True, 2), 130,
              INTERRUPTED, rows=1, fault=("sleep", 2), results_line=True),
    FaultCase("SIGTERM to pipebench mid-job", TWO_JOBS, signal_pipebench(signal.SIGTERM, False, 2), 143,
              r"^pipebench: terminated \(SIGTERM\)", rows=1, fault=("sleep", 2), results_line=True),
    FaultCase("SIGKILL to pipebench mid-job", TWO_JOBS, signal_pipebench(signal.SIGKILL, False, 2), -signal.SIGKILL,
              None, rows=1, fault=("sleep", 2)),
    FaultCase("SIGKILL to pipebench mid multi-rank job", ("workers=1", "distributed.nproc=2"),
              signal_pipebench(signal.SIGKILL, False, 2), -signal.SIGKILL, None, rows=0, fault=("sleep", 1)),
    FaultCase("SIGKILL to a job process", ("workers=0,1",), kill_marked, 1,
              r"^pipebench: error: job 1/2 .*: killed by SIGKILL: often the out-of-memory killer; check `dmesg`.*"
              r"the sweep goes on$", rows=1, fault=("sleep", 0), results_line=True),
    FaultCase("SIGKILL to a job process, run.on_job_error=stop", ("workers=0,1", "run.on_job_error=stop"),
              kill_marked, 1, r"^pipebench: error: job 1/2 .*: killed by SIGKILL.*stopping the sweep", rows=0,
              fault=("sleep", 0), results_line=True),
    FaultCase("SIGKILL to a DataLoader worker", ("workers=1",), kill_marked, 2,
              r"^pipebench: error: DataLoader worker \(pid.*\) (is killed by signal: Killed|exited unexpectedly)"
              r".*dmesg", rows=0, fault=("sleep", 1), results_line=True),
    # The Ctrl-C cases at a start run a job that hangs in the fault: a job that ran on before the
    # Ctrl-C landed would end in its own way (the default chain's PILToTensor fails on the random
    # tensors: a second line beside "interrupted", seen in a full run under load).
    FaultCase("Ctrl-C as the command starts", ("workers=0",), interrupt_at_command_start, 130, INTERRUPTED,
              rows=0, fault=("sleep", 0)),
    FaultCase("Ctrl-C as the job process starts", ("workers=0",), interrupt_at_job_start, 130, INTERRUPTED,
              rows=0, fault=("sleep", 0), results_line=True),
    FaultCase("transform spinning at workers=0", ("workers=0", f"run.step_timeout_s={SPIN_TIMEOUT_S}"), None, 2,
              r"^pipebench: error: per_sample/Fault on random tensor \d+ of \d+ \(sample \d+\) ran past "
              rf"run.step_timeout_s={SPIN_TIMEOUT_S}; stopped the job", rows=0, fault=("spin", 0), results_line=True),
    FaultCase("unknown _target_ module", ("transform.per_sample=[{_target_: nope.Nope}]",), None, 2,
              r"^pipebench: error: transform.per_sample\[0\] \(nope.Nope\): .*No module named 'nope'.*installed\?$",
              rows=0),
    FaultCase("consumer.step_ms=inf", ("consumer.step_ms=inf",), None, 2,
              r"^pipebench: error: consumer.step_ms must be a finite number, got inf$", rows=0),
    FaultCase("Ctrl-C as Hydra starts", ("workers=0",), interrupt_at_hydra_start, 130, INTERRUPTED, rows=0,
              fault=("sleep", 0)),
    *(hung_sample(backend) for backend in ("dataloader", "threads", "spdl")),
    FaultCase("image folder with two link loops", ("workers=0",), None, 0,
              IMAGE_FOLDER_LINE + r"2 links to folders already walked \(.*first: a/loop\)$", rows=1,
              results_line=True, inputs=image_folder(loop_links)),
    FaultCase("image folder with a FIFO and a /dev/zero link named *.jpg", ("workers=0",), None, 0,
              IMAGE_FOLDER_LINE + r"2 image names on no regular file, not read \(.*first: a/pipe.jpg\)$", rows=1,
              results_line=True, inputs=image_folder(endless_files)),
)
