"""Job processes: the one `pipebench run` starts ahead of its first job, handed over or ended."""

import functools
import importlib
import os
import pickle
import stat
import subprocess
import sys
import time

import psutil
import pytest
from conftest import FAST_JOB, NO_CHAIN, PIPEBENCH_SCRIPT, TINY_DATASET

from pipebench.base.errors import CRASH_EXIT_STATUS
from pipebench.measure import job_spawn
from pipebench.cli.main import job_ahead, main
from pipebench.measure.job_spawn import (
    FRAME_HEADER_BYTES,
    JOB_PROCESS_MODULE,
    JobProcess,
    discard,
    run_job,
    serving,
    start_job_process,
    take,
    warm,
)
from pipebench.sweep.calibrate import TimedCalibration

# A stand-in interpreter: keeps the first $SIZE bytes of its stdin in $OUT, leaves a grandchild
# sleeping in its process group, and exits 3 without answering, so the hand-over, a job process
# that ends instead of answering, and the group's end can all be seen.
FAKE_PYTHON = """#!/usr/bin/env bash
head -c "$SIZE" > "$OUT"
answer=$5  # the answer pipe, its last argument: a job process's job never holds it
exec {answer}>&-
sleep 1000 &
echo $! > "$OUT.sleeper"
exit 3
"""
JOB = b"pickled job"


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    path = tmp_path / "python"
    path.write_text(FAKE_PYTHON)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("OUT", str(tmp_path / "stdin.bin"))
    monkeypatch.setenv("SIZE", str(FRAME_HEADER_BYTES + len(JOB)))
    return path


def test_a_job_is_handed_over_on_stdin_and_a_job_process_that_ends_is_the_jobs_status(fake_python, tmp_path):
    process = start_job_process(str(fake_python), os.getpid(), "warm.module")
    assert run_job(process, JOB) == 3 and not serving(process)
    assert (tmp_path / "stdin.bin").read_bytes() == len(JOB).to_bytes(FRAME_HEADER_BYTES, "big") + JOB
    sleeper = int((tmp_path / "stdin.bin.sleeper").read_text())
    time.sleep(0.2)
    assert not psutil.pid_exists(sleeper) or psutil.Process(sleeper).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(ChildProcessError):  # reaped: its pid is no longer this process's to kill
        os.waitpid(process.pid, os.WNOHANG)


def test_each_job_runs_in_a_child_of_its_own_and_the_job_process_serves_the_next():
    """A job that crashes (here: a pickle that is no job) ends its child alone, with its status; the
    job process goes on to the next job and ends, reaped, when asked."""
    process = start_job_process(sys.executable, os.getpid(), "os")
    children = []
    real_read = job_spawn.read_number

    def reading(fd):
        number = real_read(fd)
        children.append(number)
        return number

    for _ in range(2):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(job_spawn, "read_number", reading)
            assert run_job(process, b"no job") == CRASH_EXIT_STATUS
        assert serving(process)
    job_pids = children[0::2]
    assert len(set(job_pids)) == 2 and process.pid not in job_pids
    discard(process, kill=False)
    assert not psutil.pid_exists(process.pid) and not any(psutil.pid_exists(pid) for pid in job_pids)


def _imported_in_a_job(process: JobProcess, module: str) -> bool:
    """Whether a job forked now would start with `module` imported: a callable payload (a check run
    in a job's place) whose status says so, built from builtins so its unpickling imports nothing."""
    probe = functools.partial(eval, f"0 if {module!r} in __import__('sys').modules else 3")
    status = run_job(process, pickle.dumps(probe))
    assert status in (0, 3), status
    return status == 0


def test_the_job_process_imports_what_an_import_frame_names_from_its_own_packages_only():
    """The chains' torchvision and pipebench modules, imported once by the job process, are there
    for every job it forks after; a module of any other package (a user's) is left to the job."""
    process = start_job_process(sys.executable, os.getpid(), "os")
    try:
        assert not _imported_in_a_job(process, "pipebench.base.tables")
        warm(process, [{"_target_": "pipebench.base.tables.markdown_table"}, {"path": "no target"},
                       {"_target_": "numpy.linalg.norm"}, {"_target_": "no_such.module.Thing"}])
        assert _imported_in_a_job(process, "pipebench.base.tables")
        assert not _imported_in_a_job(process, "numpy")
        warm(process, [{"_target_": "pipebench.no_such_module.Thing"}])  # the job that names it reports it, not this
        assert _imported_in_a_job(process, "pipebench.base.tables") and serving(process)
    finally:
        discard(process, kill=False)


def test_only_a_running_child_is_taken_and_discard_ends_only_what_was_never_run(tmp_path):
    sleeper = start_job_process(sys.executable, os.getpid(), "warm.module")  # waits on its stdin...
    # ... after failing to import "warm.module": it has ended, unreaped, so it is not taken.
    os.waitid(os.P_PID, sleeper.pid, os.WEXITED | os.WNOWAIT)
    assert take([sleeper.pid, sleeper.stdin_fd, sleeper.status_fd]) is None and take(None) is None
    discard(sleeper)
    with pytest.raises(ChildProcessError):
        os.waitpid(sleeper.pid, os.WNOHANG)

    alive = start_job_process(sys.executable, os.getpid(), "os")  # imports os, then waits for a job
    assert take([alive.pid, alive.stdin_fd, alive.status_fd]) == alive
    discard(alive)
    assert not psutil.pid_exists(alive.pid)
    # A second discard, after the pid and its descriptor number may serve others, touches neither.
    reused = os.open(os.devnull, os.O_RDONLY)
    discard(JobProcess(alive.pid, reused, reused))
    os.fstat(reused)
    os.close(reused)


def test_run_and_explore_start_ahead_only_when_they_will_launch_jobs_with_their_own_launcher():
    for words in (["compare", "a", "b"], ["report", "folder"], ["explore", "-h"], ["run", "--help"],
                  ["run", "--cfg", "job"], ["run", "--info=all"], ["run", "hydra/launcher=submitit_slurm"],
                  ["run", "hydra.launcher.python=/other/python"]):
        assert job_ahead(words) is None, words


def test_every_verb_that_runs_jobs_starts_its_first_job_process_ahead():
    for words in (["run", "workers=0"], ["explore", "workers=0"], ["tune"], ["storage-check", "workload=resnet50"]):
        ahead = job_ahead(words)
        try:
            assert ahead is not None and _unreaped_child(ahead.pid), words
        finally:
            discard(ahead)


def _unreaped_child(pid: int) -> bool:
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


@pytest.mark.slow
def test_the_first_job_runs_in_the_process_started_ahead_and_an_error_or_a_calibration_ends_it(
        tmp_path, monkeypatch, capsys):
    """Spawns are counted where both starters spawn (Hydra's plugin scan re-executes the launcher's
    module, so a name patched there would not hold): two rounds of two jobs, a job process a round,
    the first the one started ahead. A calibration timed in this process, which has imported torch,
    is timed with the process started ahead gone (its imports must not run beside the timing)."""
    spawned = []
    real_spawn = os.posix_spawnp

    def counting(path, argv, env, **kwargs):
        pid = real_spawn(path, argv, env, **kwargs)
        if JOB_PROCESS_MODULE in argv:
            spawned.append(pid)
        return pid

    monkeypatch.setattr(os, "posix_spawnp", counting)
    # Interleaved rounds: a job process a round (the one started ahead runs the first), so the
    # rounds compare pools are apart as processes. A plain sweep is one round: two spawns for four
    # jobs say both jobs of a round ran in one job process, and that the first round's was the one
    # started ahead (a third spawn otherwise).
    rounds = ["run", *FAST_JOB, *NO_CHAIN, "workers=0,1", "rounds=2", f"results_dir={tmp_path / 'rounds'}"]
    assert main(rounds) == 0, capsys.readouterr().err
    assert len(spawned) == 2 and len(list((tmp_path / "rounds").glob("*/job-*/result.json"))) == 4
    assert not _unreaped_child(spawned[-1])  # the sweep's last job process ended with it
    del spawned[1:]

    assert main(["run", *FAST_JOB, *NO_CHAIN, "trnsform=x", f"results_dir={tmp_path / 'typo'}"]) == 2
    assert len(spawned) == 2 and "trnsform" in capsys.readouterr().err
    assert not _unreaped_child(spawned[-1])  # ended and reaped by the command that started it

    # With torch imported here, the calibration is timed here too (a command without it times it in
    # a child of the process started ahead: the test below).
    importlib.import_module("torch")
    beside_calibration = []
    monkeypatch.setattr(TimedCalibration, "__call__",
                        lambda timed: beside_calibration.append(_unreaped_child(spawned[-1])) or 0)
    assert main(["run", *FAST_JOB, *NO_CHAIN, "calibrate=true", f"results_dir={tmp_path / 'calibrated'}"]) == 0
    assert beside_calibration == [False] and len(spawned) == 4  # the one ahead, ended first, then the job's own


# A `pipebench run` that says, once done, whether its own process imported torch.
RUN_SAYING_IF_TORCH = """
import sys
from pipebench.cli.main import main
status = main(sys.argv[1:])
print(f"status {status}, torch imported: {'torch' in sys.modules}")
"""


@pytest.mark.slow
def test_the_command_imports_no_torch_and_its_jobs_are_built_in_a_child_of_the_job_process(tmp_path):
    """The builds before any job (chains, datasets, backends) and the calibration run where torch is
    imported already, and a job that does not build is still one line and exit 2 before anything runs."""
    built = subprocess.run([sys.executable, "-c", RUN_SAYING_IF_TORCH, "run", *FAST_JOB, *NO_CHAIN, "calibrate=true",
                            f"results_dir={tmp_path / 'built'}"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=240)
    assert built.stdout.strip().endswith("status 0, torch imported: False"), built.stdout + built.stderr
    assert len(list(tmp_path.glob("built/*/job-*/result.json"))) == 1
    assert len(list(tmp_path.glob("built/*/calibration.json"))) == 1 and "calibration: " in built.stdout

    missing = tmp_path / "no-such-folder"
    fast_without_its_dataset = [word for word in FAST_JOB if word not in TINY_DATASET]
    unbuilt = subprocess.run([sys.executable, "-c", RUN_SAYING_IF_TORCH, "run", *fast_without_its_dataset, *NO_CHAIN,
                              "dataset=image_folder", f"dataset.path={missing}", f"results_dir={tmp_path / 'unbuilt'}"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert unbuilt.stdout.strip() == "status 2, torch imported: False", unbuilt.stdout + unbuilt.stderr
    (line,) = unbuilt.stderr.strip().splitlines()
    assert line.startswith("pipebench: error: ") and str(missing) in line
    assert not list(tmp_path.glob("unbuilt/*/job-*"))


# Imports the task function's module as a job process does, with every way torch's Python side
# reaches the CUDA driver counted: a driver touched before a fork is unusable in the forked job.
CUDA_AT_IMPORT = """
import importlib, sys, torch, torch.cuda
calls = []
for owner, name in ((torch._C, "_cuda_getDeviceCount"), (torch.cuda, "is_available"), (torch.cuda, "_lazy_init"),
                    (torch.cuda, "device_count"), (torch.cuda, "init")):
    real = getattr(owner, name)
    setattr(owner, name, lambda *a, _name=name, _real=real, **k: calls.append(_name) or _real(*a, **k))
module = importlib.import_module(sys.argv[1])
for name in module.WARM_MODULES:  # as the job process imports them (pipebench.measure.job_process)
    importlib.import_module(name)
print(calls)
"""


@pytest.mark.slow
def test_the_job_process_imports_touch_no_cuda_so_forked_jobs_can_use_it():
    out = subprocess.run([sys.executable, "-c", CUDA_AT_IMPORT, "pipebench.sweep.job_task"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# A process that ends through exit_without_teardown: its exit handler and its buffered output must
# still reach the file and the pipe, while an object's finalizer (module teardown) never runs.
ENDS_WITHOUT_TEARDOWN = """
import atexit, sys
from pipebench.base.errors import exit_without_teardown

class Torn:
    def __del__(self):
        print("torn down", flush=True)

kept = Torn()
atexit.register(lambda: open(sys.argv[1], "w").write("handler ran"))
sys.stdout.write("buffered, not flushed")
exit_without_teardown(7)
"""


def test_the_command_and_the_job_process_exit_with_their_handlers_and_output_but_no_teardown(tmp_path):
    marker = tmp_path / "handler"
    buffered = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    out = subprocess.run([sys.executable, "-c", ENDS_WITHOUT_TEARDOWN, str(marker)], capture_output=True, text=True,
                         timeout=60, env=buffered)
    assert (out.returncode, out.stdout, out.stderr) == (7, "buffered, not flushed", "")
    assert marker.read_text() == "handler ran"
    console = PIPEBENCH_SCRIPT.read_text()
    assert "from pipebench.cli.main import entry" in console  # the installed script ends this way too
