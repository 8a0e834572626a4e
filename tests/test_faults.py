"""In one process: workers that die or hang, and steps that overrun, end the job in one clear line.

The whole-CLI fault cases (signals to pipebench, to a job process, to a worker) are in
test_fault_cases.py.
"""

import dataclasses
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import QUICK_RUN, TINY_DATASET, compose_spec
from fault_transforms import ARMED

from hydra_plugins.pipebench_launcher.subprocess_launcher import failure_reason
from pipebench.base.errors import ConfigError, StepTimeoutError, StuckThreadError, WorkerError, stops_unmasked
from pipebench.base.watchdog import StepOverrun, Watchdog
from pipebench.cli.main import main
from pipebench.measure.job import measure_job
from pipebench.measure.guard import worker_faults_named
from pipebench.measure.runner import BatchStream, StepLoop
from pipebench.pipeline.build import build_pipeline
from pipebench.pipeline.loader_backends import build_loader
from pipebench.pipeline.consumers import NoConsumer

# What a watched step may overrun by before the test calls the watchdog late: start-up of the
# job (a DataLoader, a dataset pool) plus scheduling on a loaded 2-core machine.
WATCHDOG_SLACK_S = 15
# A test whose watchdog failed would spin forever: past this, faulthandler dumps every thread and
# ends the test process, so the suite is bounded even then.
HANG_BOUND_S = 120


@pytest.fixture
def bounded():
    faulthandler.dump_traceback_later(HANG_BOUND_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


class DieInWorker:
    """Kills its worker process outright, as the OOM killer would."""

    def __call__(self, sample):
        os._exit(3)


def _spec(per_sample, extra=()):
    spec = compose_spec([*TINY_DATASET, *QUICK_RUN, "workers=1", "consumer=none", "run.profile_steps=0", *extra])
    return dataclasses.replace(spec, per_sample=tuple(per_sample))


def _fault(tmp_path, action):
    (tmp_path / ARMED).touch()
    return {"_target_": "fault_transforms.Fault", "marker_dir": str(tmp_path), "action": action}


def test_dead_worker_is_a_worker_error(tmp_path):
    spec = _spec([{"_target_": f"{__name__}.DieInWorker"}])
    with pytest.raises(WorkerError, match="exited unexpectedly") as caught:
        measure_job(spec, tmp_path)
    assert "\n" not in str(caught.value) and "dmesg" in str(caught.value)


# How often a held worker looks for its release.
HOLD_POLL_S = 0.01


class HoldInWorker:
    """Hangs its worker process until the file `held` is removed, then ends it with status 0. A
    worker left alive (a 20 s sleep, or idle once let go) kept the loader's shutdown, when it was
    collected in a later test, waiting 5 s for it (torch's MP_STATUS_CHECK_INTERVAL); one that ended
    quietly is no worker failure to torch."""

    def __init__(self, held: str) -> None:
        self.held = Path(held)

    def __call__(self, sample):
        while self.held.exists():
            time.sleep(HOLD_POLL_S)
        os._exit(0)


def test_hung_worker_times_out(tmp_path):
    held = tmp_path / "held"
    held.touch()
    spec = _spec([{"_target_": f"{__name__}.HoldInWorker", "held": str(held)}], ["loader.timeout_s=1"])
    start = time.monotonic()
    try:
        with pytest.raises(WorkerError, match="timed out") as caught:
            measure_job(spec, tmp_path)
    finally:
        held.unlink()
    assert time.monotonic() - start < 15, "a hung worker must not hang the benchmark"
    assert "loader.timeout_s=1" in str(caught.value)


# Set when a test ends: a thread stuck in HangUntilReleased cannot be stopped, so the test lets it go.
RELEASE = threading.Event()


class HangUntilReleased:
    """Hangs the thread that calls it (a thread backend's worker) until the test releases it."""

    def __call__(self, sample):
        RELEASE.wait(HANG_BOUND_S)
        return sample


@pytest.fixture
def released():
    RELEASE.clear()
    yield
    RELEASE.set()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["threads", "spdl"])
def test_hung_thread_times_out_as_a_hung_worker_does(tmp_path, backend, released):
    spec = _spec([{"_target_": f"{__name__}.HangUntilReleased"}], ["loader.timeout_s=1", f"loader.backend={backend}"])
    start = time.monotonic()
    with pytest.raises(StuckThreadError, match=rf"^{backend} timed out after 1\.0 seconds \(loader.timeout_s=1; ") as caught:
        measure_job(spec, tmp_path)
    assert time.monotonic() - start < 15, "a hung thread must not hang the benchmark"
    assert "\n" not in str(caught.value) and "the job process exits without it" in str(caught.value)
    assert isinstance(caught.value, WorkerError), "the same kind of fault as a hung DataLoader worker"


class KillWorkerThenSleep:
    """A consumer whose step kills the worker that made the batch, then sleeps: torch's SIGCHLD
    handler raises the worker's death in the middle of the sleep, not in next()."""

    device = NoConsumer.device

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path

    def step(self, data, labels):
        pid = int(next(p.name for p in self.tmp_path.iterdir() if p.name.isdigit()))
        os.kill(pid, signal.SIGKILL)
        time.sleep(30)


@pytest.mark.slow
def test_worker_death_during_the_consumer_step_is_a_worker_error(tmp_path, bounded):
    spec = _spec([_fault(tmp_path, "pass")])
    _, instrumented, collate = build_pipeline(spec)
    loop = StepLoop(BatchStream(build_loader(spec, instrumented, collate), "fail"), KillWorkerThenSleep(tmp_path),
                    non_blocking=False)
    start = time.monotonic()
    with pytest.raises(WorkerError, match="killed by signal") as caught, worker_faults_named(spec.loader.timeout_s):
        loop.step(None)
    assert time.monotonic() - start < 20, "the death must cut the consumer's sleep short"
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("action", ["spin", "sleep"])
def test_hung_transform_in_process_is_stopped_naming_it_and_its_sample(tmp_path, action, bounded):
    spec = _spec([_fault(tmp_path, action)], ["workers=0", "run.step_timeout_s=1"])
    start = time.monotonic()
    with pytest.raises(StepTimeoutError) as caught:
        measure_job(spec, tmp_path)
    assert time.monotonic() - start < 1 + WATCHDOG_SLACK_S
    message = str(caught.value)
    assert "\n" not in message and "per_sample/Fault on random tensor" in message, message
    assert "(sample " in message and "run.step_timeout_s=1" in message


class SlowConsumer:
    device = NoConsumer.device

    def step(self, data, labels):
        time.sleep(30)


def test_consumer_step_past_the_limit_is_stopped(tmp_path, bounded):
    spec = _spec([], ["workers=0"])
    _, instrumented, collate = build_pipeline(spec)
    loop = StepLoop(BatchStream(build_loader(spec, instrumented, collate), "fail"), SlowConsumer(),
                    non_blocking=False)
    with Watchdog(0.5, "run.step_timeout_s", on_stuck=print) as loop.watchdog:
        with pytest.raises(StepTimeoutError, match=r"the consumer step .* ran past run.step_timeout_s=0.5"):
            loop.step(None)


@pytest.mark.slow
def test_watchdog_leaves_steps_within_the_limit_alone(bounded):
    with Watchdog(0.3, "limit", on_stuck=print) as watchdog:
        for _ in range(5):
            watchdog.arm("a short step")
            time.sleep(0.1)
            watchdog.disarm()
            time.sleep(0.4)  # unarmed time is never an overrun
        watchdog.arm("a busy step")
        with pytest.raises(StepOverrun, match="a busy step ran past limit=0.3"):
            while True:
                pass


STUCK_STEP = """
import signal, time
from pipebench.base.watchdog import Watchdog
with Watchdog(0.2, 'run.step_timeout_s', on_stuck=print, grace_s=0.5) as watchdog:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as native code that never returns
    watchdog.arm('a stuck step')
    time.sleep(30)
"""


def test_a_step_stuck_in_native_code_ends_the_process_in_one_line():
    proc = subprocess.run([sys.executable, "-c", STUCK_STEP], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines() == [
        "a stuck step ran past run.step_timeout_s=0.2 and did not stop when interrupted 0.5 s later "
        "(stuck in native code); ended the job"]


@pytest.mark.slow
@pytest.mark.parametrize("overrides,named", [
    (["consumer.step_ms=1e12"], "consumer.step_ms must be >= 0 and <= 60000"),
    (["consumer.step_ms=inf"], "consumer.step_ms must be a finite number"),
    (["consumer.step_ms=nan"], "consumer.step_ms must be a finite number"),
    (["consumer.step_ms=50000", "run.step_timeout_s=30"], "must stay below run.step_timeout_s"),
    (["run.min_time_s=inf"], "run.min_time_s must be a finite number"),
    (["run.steps=10000000000"], "run.steps must be >= 1 and <= 1e+06"),
    (["run.step_timeout_s=0"], "run.step_timeout_s must be > 0"),
    (["loader.timeout_s=1e12"], "loader.timeout_s must be > 0 and <= 86400"),
    (["loader.batch_size=100000000"], "loader.batch_size must be >= 1 and <= 65536"),
    (["loader.prefetch_factor=100000"], "loader.prefetch_factor"),
    (["workers=100000"], "workers must be >= 0 and <= 256"),
    (["run.seed=-1"], "run.seed"),
    (["run.on_job_error=retry"], "run.on_job_error must be one of continue, stop"),
    (["distributed.job_timeout_s=inf"], "distributed.job_timeout_s must be a finite number"),
])
def test_values_that_would_hang_or_overflow_are_refused_up_front(overrides, named):
    with pytest.raises(ConfigError) as caught:
        compose_spec(overrides)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_on_job_error_applies_to_the_whole_sweep(capsys, tmp_path):
    assert main(["run", "run.on_job_error=continue,stop", *TINY_DATASET, f"results_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pipebench: error: run.on_job_error applies to the whole invocation") and "\n" not in err


def test_a_job_killed_by_a_signal_is_named_with_its_usual_cause(tmp_path):
    assert failure_reason(-signal.SIGKILL, tmp_path) == (
        "killed by SIGKILL: often the out-of-memory killer; check `dmesg` or `journalctl -k`", False)
    assert failure_reason(-signal.SIGSEGV, tmp_path)[0].startswith("killed by SIGSEGV: a crash in native code")
    (tmp_path / "error.txt").write_text("dataset: no images\n")
    assert failure_reason(2, tmp_path) == ("dataset: no images", True)
    assert failure_reason(1, tmp_path) == ("exited with status 1; its output above says why", False)


def _half_built_node_cleanup(args) -> int:
    """A verb interrupted inside a library whose clean-up then fails on what the interrupt left half
    built, as omegaconf's flag reset did in CI: the AttributeError carries the Ctrl-C as its context."""
    try:
        raise KeyboardInterrupt
    finally:
        raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")


def test_an_error_raised_while_ctrl_c_unwinds_still_ends_in_the_interrupted_line(monkeypatch, capsys):
    verb = type(sys)("pipebench.cli.report")
    verb.add_parser = lambda verbs: verbs.add_parser("report")
    verb.main = _half_built_node_cleanup
    monkeypatch.setattr("pipebench.cli.main.verbs", lambda names=(): (verb,))
    assert main(["report"]) == 130
    assert capsys.readouterr().err.strip() == "pipebench: interrupted"


def test_an_error_with_no_stop_behind_it_is_left_as_it_is():
    with pytest.raises(AttributeError, match="half built"):
        with stops_unmasked():
            try:
                raise ValueError("first")
            finally:
                raise AttributeError("half built")
