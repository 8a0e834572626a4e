"""trace=viztracer: one merged trace of the main process and every DataLoader worker.

Each test runs a real DataLoader (or a real child process) and reads the merged JSON back: the
slices must come from the processes that really did the work, in the numbers they did it.
"""

import json
import multiprocessing
import os
import pickle
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pipebench import viztrace
from pipebench.viztrace import TRACE_FILE, VizTraceSession, emit, span

SAMPLES = 32
BATCH = 8
WORKERS = 2
STEPS = ("load/Tiny", "per_sample/Work", "per_sample/Scale")
MAIN_STEP = "main/consume"
# finish() must come back well inside this even when workers are alive (persistent workers).
NO_HANG_S = 5.0


def _busy(us: float) -> None:
    end = time.perf_counter_ns() + int(us * 1000)
    while time.perf_counter_ns() < end:
        pass


class TracedTiny(Dataset):
    """A little work per sample in three timed steps, each emitted as one slice, as the timed
    chain does. Returns the pid that made the sample, so the test knows the real workers."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        t0 = time.perf_counter_ns()
        x = torch.full((64,), float(index))
        t1 = time.perf_counter_ns()
        emit(STEPS[0], t0, t1)
        _busy(200)
        x = x * 2
        t2 = time.perf_counter_ns()
        emit(STEPS[1], t1, t2)
        x = x / 255
        t3 = time.perf_counter_ns()
        emit(STEPS[2], t2, t3)
        return x, os.getpid()


def _consume(loader: DataLoader, epochs: int = 1) -> set:
    pids = set()
    for _ in range(epochs):
        for data, made_by in loader:
            with span(MAIN_STEP):
                data.sum()
            pids.update(made_by.tolist())
    return pids


def _loader(session: VizTraceSession, context: str, persistent: bool = False) -> DataLoader:
    return DataLoader(TracedTiny(), batch_size=BATCH, num_workers=WORKERS, multiprocessing_context=context,
                      worker_init_fn=session, persistent_workers=persistent)


def _load_trace(path: Path) -> dict:
    """The merged file is Chrome trace JSON: a traceEvents list of events with ph/pid/tid, and
    ts (+ dur for complete slices) on everything that is not metadata."""
    assert path.name == TRACE_FILE and path.is_file()
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    for event in events:
        assert {"ph", "pid", "tid", "name"} <= event.keys(), event
        if event["ph"] != "M":
            assert isinstance(event["ts"], (int, float)), event
        if event["ph"] == "X":
            assert event["dur"] >= 0, event
    assert not [e for e in events if e["ph"] == "B"], "unterminated slices make Perfetto draw open bars"
    return trace


def _step_slices(trace: dict) -> dict:
    """pid -> Counter of pipebench slice names."""
    per_pid = defaultdict(Counter)
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e.get("cat") == viztrace.CATEGORY:
            per_pid[e["pid"]][e["name"]] += 1
    return per_pid


def _assert_main_and_workers(trace: dict, worker_pids: set, samples_per_worker_total: int) -> None:
    main_pid = os.getpid()
    slices = _step_slices(trace)
    assert len(worker_pids) == WORKERS and main_pid not in worker_pids
    assert slices[main_pid][MAIN_STEP] == samples_per_worker_total // BATCH
    assert set(slices) - {main_pid} == worker_pids, "every worker, and only the workers, made step slices"
    for step in STEPS:
        assert sum(slices[pid][step] for pid in worker_pids) == samples_per_worker_total, step
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"pipebench main", "pipebench worker 0", "pipebench worker 1"} <= names


@pytest.fixture
def session(tmp_path):
    made = []

    def make(**kwargs):
        s = VizTraceSession(work_dir=str(tmp_path / "parts"), **kwargs)
        made.append(s)
        return s

    yield make
    viztrace._recorder = None  # never leak a recorder into the next test


def test_fork_workers_merge_into_one_trace(session, tmp_path):
    s = session()
    s.start_main()
    pids = _consume(_loader(s, "fork"))
    started = time.monotonic()
    path = s.finish(tmp_path)
    assert time.monotonic() - started < NO_HANG_S
    trace = _load_trace(path)
    _assert_main_and_workers(trace, pids, SAMPLES)
    assert s.summary["workers_not_closed"] == {}, "non-persistent workers exit cleanly and write their last part"
    assert not Path(s.work_dir).exists(), "the per-process parts are cleaned up"
    # The time base is shared: every worker slice lies inside the main process's traced span.
    ts = [e["ts"] for e in trace["traceEvents"] if e["ph"] == "X"]
    assert max(ts) - min(ts) < 60e6


def test_persistent_workers_are_flushed_without_waiting_for_exit(session, tmp_path):
    s = session()
    s.start_main()
    loader = _loader(s, "fork", persistent=True)
    pids = _consume(loader, epochs=2)
    started = time.monotonic()
    path = s.finish(tmp_path)  # the workers are still alive, blocked on their index queues
    elapsed = time.monotonic() - started
    assert elapsed < NO_HANG_S, f"finish took {elapsed:.1f}s with live workers"
    assert all(state.startswith("alive") for state in s.summary["workers_not_closed"].values())
    assert {int(pid) for pid in s.summary["workers_not_closed"]} == pids
    _assert_main_and_workers(_load_trace(path), pids, 2 * SAMPLES)
    del loader  # workers shut down now and try a last flush into the removed folder: no error


def test_spawn_workers_are_traced(session, tmp_path):
    s = session()
    s.start_main()
    pids = _consume(_loader(s, "spawn"))
    _assert_main_and_workers(_load_trace(s.finish(tmp_path)), pids, SAMPLES)


def test_full_mode_adds_function_calls_from_every_process(session, tmp_path):
    s = session(mode="full", tracer_entries=50_000)
    s.start_main()
    pids = _consume(_loader(s, "fork"))
    trace = _load_trace(s.finish(tmp_path))
    _assert_main_and_workers(trace, pids, SAMPLES)
    calls = defaultdict(set)
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e.get("cat") == "fee":
            calls[e["pid"]].add(e["name"].split(" ")[0].split(".")[-1])
    for pid in pids:
        assert "__getitem__" in calls[pid] and "_busy" in calls[pid], "VizTracer ran inside the worker"
    assert "_consume" in calls[os.getpid()]


def _killed_worker(s: VizTraceSession, kept: int, lost: int) -> None:
    s.worker_init(0)
    now = time.perf_counter_ns()
    for i in range(kept):
        emit("kept", now + i, now + i + 1)
    viztrace.recorder().flush()  # what the periodic flush does every flush_interval_s
    for i in range(lost):
        emit("lost", now + i, now + i + 1)
    os._exit(0)  # what torch's worker SIGTERM handler does: no finalisers, no last flush


def test_worker_killed_by_its_parent_keeps_its_periodic_parts(session, tmp_path):
    s = session()
    s.start_main()
    child = multiprocessing.get_context("fork").Process(target=_killed_worker, args=(s, 7, 3))
    child.start()
    child.join(10)
    trace = _load_trace(s.finish(tmp_path))
    slices = _step_slices(trace)[child.pid]
    assert slices == Counter({"kept": 7})
    assert s.summary["workers_not_closed"][str(child.pid)].startswith("killed")


def _deaf_worker(s: VizTraceSession, ready) -> None:
    s.worker_init(0)
    signal.signal(viztrace.FLUSH_SIGNAL, signal.SIG_IGN)  # never answers a flush request
    ready.set()
    time.sleep(60)


def test_finish_never_waits_past_its_deadline(session, tmp_path):
    s = session()
    s.start_main()
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_deaf_worker, args=(s, ready), daemon=True)
    child.start()
    try:
        assert ready.wait(10)
        started = time.monotonic()
        path = s.finish(tmp_path, timeout_s=0.5)
        assert time.monotonic() - started < 2.0
        assert "deadline" in s.summary["workers_not_closed"][str(child.pid)]
        _load_trace(path)
    finally:
        child.kill()
        child.join(5)


def test_session_pickles_and_emit_without_a_recorder_is_a_no_op(session):
    s = session(flush_interval_s=0.5)
    clone = pickle.loads(pickle.dumps(s))
    assert clone.work_dir == s.work_dir and clone.flush_interval_s == 0.5
    assert viztrace.recorder() is None
    emit("nothing", 0, 1)
    with span("nothing"):
        pass


def test_bad_mode_is_one_line_error():
    with pytest.raises(viztrace.VizTraceError, match="mode must be one of sparse, full"):
        VizTraceSession(mode="everything")
