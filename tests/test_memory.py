"""MemorySampler against known allocations made by forked children, in /dev/shm, and copy-on-read."""

import json
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import psutil
import pytest

from pipebench.measure import memory as memory_module
from pipebench.measure.memory import MemorySampler
from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
# A PSS reading moves when another process maps or unmaps the libraries this one shares (torch's), so
# the growth tests run alone too. The tests marked `beside` read pids, labels, marks, a /dev/shm high
# water that others can only raise, a prompt stop, or readings faked through monkeypatch: they share
# the cores.
pytestmark = pytest.mark.alone

FORK = multiprocessing.get_context("fork")

# What a child allocates and touches between the marks. Large against the noise: the child's
# own interpreter dirties a few hundred kB of shared pages while it serves the pipe.
ALLOC_MB = 60
# How far the measured growth may stray from the allocation, and how far "no growth" may stray from 0.
TOLERANCE_MB = 6
# What the /dev/shm test writes.
SHM_FILE_MB = 20
# Enough distinct ints (~61 MB of int objects) for copy-on-read to stand far above the noise,
# yet built and iterated in well under a second.
COPY_ON_READ_ITEMS = 2_000_000
# A small int object is 28 bytes, which CPython's allocator rounds up to a 32-byte block.
INT_OBJECT_BYTES = 32
# A short gap and a loose CPU budget make background samples come fast enough for a test.
FAST = dict(interval_s=0.05, max_cpu_fraction=0.5)
# A gap no test waits for, so only start, marks and stop sample.
MARKS_ONLY_INTERVAL_S = 60.0
SAMPLER_THREAD = "pipebench-memory-sampler"


def _serve(conn, data=None) -> None:
    """Child: run the parent's commands, answering each one once it is done."""
    held = []
    while True:
        command = conn.recv()
        if command == "exit":
            return
        if command == "alloc":
            held.append(b"\x01" * (ALLOC_MB << 20))  # bytes * n writes every page
        elif command == "iterate":
            for _ in data:  # touches each element's refcount when the elements are Python objects
                pass
        conn.send(command)


@contextmanager
def _child(data=None):
    """A forked child that serves commands. Yields (process, do), where do(cmd) waits for the answer."""
    parent_end, child_end = FORK.Pipe()
    proc = FORK.Process(target=_serve, args=(child_end, data), daemon=True)
    proc.start()

    def do(command: str) -> None:
        parent_end.send(command)
        if command != "exit":
            assert parent_end.recv() == command

    try:
        yield proc, do
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()


def _wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _by_pid(report, pid):
    return next(p for p in report.processes if p.pid == pid)


def test_allocations_in_children_are_worker_growth_not_main_growth():
    with _child() as (first, do_first), _child() as (second, do_second):
        with MemorySampler(interval_s=MARKS_ONLY_INTERVAL_S) as mem:
            mem.mark(FIRST_MEASURED)
            do_first("alloc")
            do_second("alloc")
            mem.mark(LAST_MEASURED)
        report = mem.stop()
    assert report.worker_pss_growth_mb == pytest.approx(2 * ALLOC_MB, abs=TOLERANCE_MB)
    assert report.main_pss_growth_mb == pytest.approx(0, abs=TOLERANCE_MB)
    for proc in (first, second):
        child = _by_pid(report, proc.pid)
        assert child.label.startswith("worker_")
        assert child.rss_mb_peak >= ALLOC_MB
        growth = child.pss_mb_at[LAST_MEASURED] - child.pss_mb_at[FIRST_MEASURED]
        assert growth == pytest.approx(ALLOC_MB, abs=TOLERANCE_MB)
    main = _by_pid(report, os.getpid())
    assert main.label == "main"
    assert report.rss_mb_peak >= main.rss_mb_peak + 2 * ALLOC_MB  # a sum over processes, not a max
    assert report.pss_mb_peak >= 2 * ALLOC_MB


@pytest.mark.beside
def test_multiprocessing_helpers_are_not_workers():
    # A spawn lock starts the resource tracker, a child that lives as long as this process: a later
    # loader's report would count it as a worker.
    multiprocessing.get_context("spawn").Lock()
    helpers = [c.pid for c in psutil.Process().children() if any("resource_tracker" in part for part in c.cmdline())]
    assert helpers, "no resource tracker was started"
    with _child() as (worker, _):
        with MemorySampler(interval_s=MARKS_ONLY_INTERVAL_S) as mem:
            pass
        report = mem.stop()
    assert sorted(p.pid for p in report.processes) == sorted([os.getpid(), worker.pid])


@pytest.mark.beside
def test_child_exiting_mid_run_keeps_sampling_and_stays_in_report():
    with _child() as (first, _):
        with MemorySampler(**FAST) as mem:
            with _child() as (second, do_second):  # forked after start(): seen second
                mem.mark("both_alive")
                do_second("exit")
                # Not is_alive(): it would reap the child, and the zombie is the case to test.
                _wait_for(lambda: psutil.Process(second.pid).status() == psutil.STATUS_ZOMBIE)
                exited = mem.samples
                _wait_for(lambda: mem.samples >= exited + 2)  # sampled while a zombie
                mem.mark("zombie")
            reaped = mem.samples
            _wait_for(lambda: mem.samples >= reaped + 2)  # and after it was reaped
            mem.mark(LAST_MEASURED)
        report = mem.stop()
    # Other children of the test process (a resource tracker from earlier tests) may come first.
    assert _by_pid(report, first.pid).label.startswith("worker_")
    gone = _by_pid(report, second.pid)
    assert gone.label.startswith("worker_")
    assert gone.rss_mb_peak > 0 and "both_alive" in gone.pss_mb_at
    assert "zombie" not in gone.pss_mb_at and LAST_MEASURED not in gone.pss_mb_at  # gone, not zeros
    assert LAST_MEASURED in _by_pid(report, first.pid).pss_mb_at


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm")
@pytest.mark.beside
def test_shm_high_water_sees_a_file_written_during_the_run():
    with MemorySampler(interval_s=MARKS_ONLY_INTERVAL_S) as mem:
        with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="pipebench-test-") as f:
            f.write(b"\x01" * (SHM_FILE_MB << 20))
            f.flush()
            mem.mark("written")
            path = f.name
    report = mem.stop()
    assert not os.path.exists(path)
    # Others may use /dev/shm at the same time; they can only push the high-water mark up.
    assert report.shm_mb_peak >= SHM_FILE_MB - 1
    assert report.shm_mb_peak_abs >= report.shm_mb_start + SHM_FILE_MB - 1


@pytest.mark.beside
def test_report_is_json_and_the_thread_stops_promptly():
    with MemorySampler(interval_s=MARKS_ONLY_INTERVAL_S) as mem:
        assert any(t.name == SAMPLER_THREAD for t in threading.enumerate())
        started = time.monotonic()
    assert time.monotonic() - started < 1.0  # did not wait out the 60 s interval
    assert not any(t.name == SAMPLER_THREAD for t in threading.enumerate())
    report = mem.stop()
    assert json.loads(json.dumps(asdict(report)))["samples"] == report.samples == 2  # start and stop
    with pytest.raises(RuntimeError):
        mem.mark(LAST_MEASURED)


@pytest.mark.beside
def test_the_thread_stops_when_the_benchmark_raises():
    with pytest.raises(ZeroDivisionError):
        with MemorySampler(**FAST):
            1 / 0
    assert not any(t.name == SAMPLER_THREAD for t in threading.enumerate())


def test_sampling_stays_within_its_cpu_budget():
    budget = 0.05
    with _child():
        # An interval far below one sample's cost: only the budget spaces the samples.
        with MemorySampler(interval_s=0.001, max_cpu_fraction=budget) as mem:
            time.sleep(1.5)
        report = mem.stop()
    background = report.samples - 2  # all but the start and stop samples
    cost_s = report.sampling_cost_ms_mean / 1e3
    # main + 1 child, CPU ms; reading smaps_rollup scales with resident pages, and a test
    # process that has loaded torch and run other tests holds many more than a fresh one.
    assert 0 < report.sampling_cost_ms_mean < 250
    assert background >= 1
    assert background * cost_s <= budget * report.duration_s + cost_s  # the last gap is cut short
    assert background < report.duration_s / 0.001 / 10


@pytest.mark.beside
def test_pss_denied_keeps_rss_and_reports_pss_as_none(monkeypatch):
    def denied(self):
        raise psutil.AccessDenied(self.pid)

    monkeypatch.setattr(psutil.Process, "memory_full_info", denied)
    with MemorySampler(interval_s=MARKS_ONLY_INTERVAL_S) as mem:
        mem.mark(FIRST_MEASURED)
        mem.mark(LAST_MEASURED)
    report = mem.stop()
    assert report.rss_mb_peak > 0
    assert report.pss_mb_peak is None and report.main_pss_growth_mb is None
    assert _by_pid(report, os.getpid()).pss_mb_at == {FIRST_MEASURED: None, LAST_MEASURED: None}


@pytest.mark.beside
def test_a_job_forked_from_the_job_process_counts_that_process_share_of_their_pages(monkeypatch):
    """The job process's PSS less its USS is the half of each page it shares with the job that a
    fresh interpreter would own alone: it lands on the main process, the marks and the peak."""
    mib, share_mib, main_mib, parent = 1 << 20, 150, 400, os.getppid()
    readings = {os.getpid(): SimpleNamespace(rss=600 * mib, pss=main_mib * mib, uss=300 * mib),
                parent: SimpleNamespace(rss=500 * mib, pss=(50 + share_mib) * mib, uss=50 * mib)}
    monkeypatch.setattr(psutil.Process, "memory_full_info", lambda self: readings[self.pid])
    monkeypatch.setattr(memory_module, "_processes", lambda pid: [psutil.Process(pid)])
    for forked_from, expected in ((parent, main_mib + share_mib), (None, main_mib)):
        with MemorySampler(interval_s=MARKS_ONLY_INTERVAL_S, forked_from=forked_from) as mem:
            mem.mark(FIRST_MEASURED)
            mem.mark(LAST_MEASURED)
        report = mem.stop()
        assert report.pss_mb_peak == expected
        assert _by_pid(report, os.getpid()).pss_mb_at == {FIRST_MEASURED: expected, LAST_MEASURED: expected}
        assert report.main_pss_growth_mb == 0


@pytest.mark.beside
def test_unreadable_proc_and_shm_degrade_to_none(monkeypatch):
    def denied(*args, **kwargs):
        raise psutil.AccessDenied()

    def unreadable(path):
        raise PermissionError(path)

    monkeypatch.setattr(psutil, "Process", denied)
    monkeypatch.setattr(shutil, "disk_usage", unreadable)
    with MemorySampler(**FAST) as mem:
        mem.mark(FIRST_MEASURED)
        _wait_for(lambda: mem.samples >= 3)
        mem.mark(LAST_MEASURED)
    report = mem.stop()
    assert report.processes == ()
    assert report.rss_mb_peak is None and report.pss_mb_peak is None
    assert report.main_pss_growth_mb is None and report.worker_pss_growth_mb is None
    assert report.shm_mb_start is None and report.shm_mb_peak is None and report.shm_mb_peak_abs is None
    json.dumps(asdict(report))


def _copy_on_read_growth(data):
    """(worker, main) PSS growth in MB while a forked child iterates over `data`."""
    with _child(data) as (_, do):
        with MemorySampler(interval_s=MARKS_ONLY_INTERVAL_S) as mem:
            mem.mark(FIRST_MEASURED)
            do("iterate")
            mem.mark(LAST_MEASURED)
        report = mem.stop()
    return report.worker_pss_growth_mb, report.main_pss_growth_mb


def test_copy_on_read_grows_pss_for_python_objects_but_not_for_a_numpy_array():
    """The classic Python-object dataset problem (pytorch issue #13246), measured.

    Iterating a list increments each int's refcount, so the child copies every page of int
    objects. PSS splits the cost: half shows in the child, and half in main, which is left the
    only owner of the originals. Together they grow by the copied bytes. The same numbers in one
    numpy buffer are only read, so nothing is copied.
    """
    copied_mb = COPY_ON_READ_ITEMS * INT_OBJECT_BYTES / (1 << 20)
    worker, main = _copy_on_read_growth([i + 1000 for i in range(COPY_ON_READ_ITEMS)])
    assert worker == pytest.approx(copied_mb / 2, abs=TOLERANCE_MB)
    assert worker + main == pytest.approx(copied_mb, abs=TOLERANCE_MB)  # USS would double-count
    worker, main = _copy_on_read_growth(np.arange(COPY_ON_READ_ITEMS, dtype=np.int64) + 1000)
    assert worker == pytest.approx(0, abs=TOLERANCE_MB)
    assert main == pytest.approx(0, abs=TOLERANCE_MB)
