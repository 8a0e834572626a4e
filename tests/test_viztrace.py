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

from pipebench.datasets.sharded_stream import ShardedStream
from pipebench.measure import viztrace
from pipebench.measure.viztrace import TRACE_FILE, Recorder, VizTraceSession
from pipebench.pipeline.timed_chain import InstrumentedDataset, TimedCollate, WorkerInit
from pipebench.pipeline.timed_iterable import InstrumentedIterable
from pipebench.transforms.synthetic import BusyWait

# No test here reads a rate, a CPU time or the host's load: they count slices per process and bound
# finish() by its deadline, so the module shares the cores (none is marked `alone`).

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
    """A little work per sample in three timed steps, each recorded as one slice into the recorder
    on this object (`trace`), as the timed chain does. Returns the pid that made the sample, so the
    test knows the real workers."""

    trace = None

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        rec = self.trace
        assert rec is None or rec.pid == os.getpid(), "a worker must never record into an inherited recorder"
        t0 = time.perf_counter_ns()
        x = torch.full((64,), float(index))
        t1 = time.perf_counter_ns()
        _busy(200)
        x = x * 2
        t2 = time.perf_counter_ns()
        x = x / 255
        t3 = time.perf_counter_ns()
        if rec is not None:
            rec.add(STEPS[0], t0, t1)
            rec.add(STEPS[1], t1, t2)
            rec.add(STEPS[2], t2, t3)
        return x, os.getpid()


def _consume(loader: DataLoader, rec: Recorder, epochs: int = 1) -> set:
    pids = set()
    for _ in range(epochs):
        for data, made_by in loader:
            t0 = time.perf_counter_ns()
            data.sum()
            rec.add(MAIN_STEP, t0, time.perf_counter_ns())
            pids.update(made_by.tolist())
    return pids


def _loader(session: VizTraceSession, context: str, persistent: bool = False,
            dataset: Dataset = None) -> DataLoader:
    # worker_init_fn=session: each worker sets its own recorder on its copy of the dataset.
    return DataLoader(dataset or TracedTiny(), batch_size=BATCH, num_workers=WORKERS,
                      multiprocessing_context=context, worker_init_fn=session, persistent_workers=persistent)


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
    def make(**kwargs):
        return VizTraceSession(work_dir=str(tmp_path / "parts"), **kwargs)

    return make


def test_fork_workers_merge_into_one_trace(session, tmp_path):
    s = session()
    dataset = TracedTiny()
    # The main recorder is on the dataset before the fork: each worker inherits it and must swap
    # in its own before its first sample (TracedTiny asserts it records into its own process's).
    rec = s.start_main(dataset)
    assert dataset.trace is rec
    pids = _consume(_loader(s, "fork", dataset=dataset), rec)
    started = time.monotonic()
    path = s.finish(tmp_path)
    assert time.monotonic() - started < NO_HANG_S
    assert dataset.trace is None, "finish() takes the recorder off the objects start_main() set it on"
    trace = _load_trace(path)
    _assert_main_and_workers(trace, pids, SAMPLES)
    assert s.summary["workers_not_closed"] == {}, "non-persistent workers exit cleanly and write their last part"
    assert not Path(s.work_dir).exists(), "the per-process parts are cleaned up"
    # The time base is shared: every worker slice lies inside the main process's traced span.
    ts = [e["ts"] for e in trace["traceEvents"] if e["ph"] == "X"]
    assert max(ts) - min(ts) < 60e6


def test_persistent_workers_are_flushed_without_waiting_for_exit(session, tmp_path):
    s = session()
    rec = s.start_main()
    loader = _loader(s, "fork", persistent=True)
    pids = _consume(loader, rec, epochs=2)
    started = time.monotonic()
    path = s.finish(tmp_path)  # the workers are still alive, blocked on their index queues
    elapsed = time.monotonic() - started
    assert elapsed < NO_HANG_S, f"finish took {elapsed:.1f}s with live workers"
    assert all(state.startswith("alive") for state in s.summary["workers_not_closed"].values())
    assert {int(pid) for pid in s.summary["workers_not_closed"]} == pids
    _assert_main_and_workers(_load_trace(path), pids, 2 * SAMPLES)
    del loader  # workers shut down now and try a last flush into the removed folder: no error


class TinyBase(Dataset):
    """The user's dataset under the real timed chain."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        return torch.full((16,), float(index)), index


@pytest.mark.slow
def test_spawn_workers_trace_the_real_chain(session, tmp_path):
    """The real chain objects under spawn: the dataset, collate and worker init are pickled to the
    workers without any recorder, and each worker's collate finds the worker's own recorder."""
    s = session()
    dataset = InstrumentedDataset(TinyBase(), [BusyWait(0.05)])
    collate = TimedCollate([])
    rec = s.start_main(dataset, collate)
    loader = DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, multiprocessing_context="spawn",
                        collate_fn=collate, worker_init_fn=WorkerInit(None, s))
    worker_ids = set()
    for batch in loader:
        t0 = time.perf_counter_ns()
        worker_ids.add(batch.worker_id)
        rec.add(MAIN_STEP, t0, time.perf_counter_ns())
    slices = _step_slices(_load_trace(s.finish(tmp_path)))
    main_pid = os.getpid()
    workers = set(slices) - {main_pid}
    assert worker_ids == {0, 1} and len(workers) == WORKERS
    assert set(slices[main_pid]) == {MAIN_STEP}, "the main process loaded nothing"
    for name, count in (("load/TinyBase", SAMPLES), ("per_sample/BusyWait", SAMPLES),
                        ("collate/default_collate", SAMPLES // BATCH)):
        assert sum(slices[pid][name] for pid in workers) == count, name


@pytest.mark.parametrize("stream", [False, True], ids=["map_style", "stream"])
def test_chain_records_one_slice_per_step_in_the_main_process(session, tmp_path, stream):
    """workers=0: the main-process objects trace into the recorder start_main() put on them, and
    the results are the same as with trace off; a stream's steps are sliced as a map-style
    dataset's (they once took a path that recorded nothing)."""
    s = session()
    transforms = [BusyWait(0.0), BusyWait(0.0)]
    dataset = InstrumentedIterable(ShardedStream(TinyBase()), transforms) if stream else \
        InstrumentedDataset(TinyBase(), transforms)
    collate = TimedCollate([])
    loader = DataLoader(dataset, batch_size=BATCH, collate_fn=collate)  # workers=0
    plain = next(iter(loader))
    s.start_main(dataset, collate)
    traced = next(iter(loader))
    assert torch.equal(plain.data, traced.data) and plain.sample_ns.shape == traced.sample_ns.shape
    slices = _step_slices(_load_trace(s.finish(tmp_path)))[os.getpid()]
    load = "load/ShardedStream" if stream else "load/TinyBase"
    assert slices == Counter({load: BATCH, "per_sample/BusyWait": BATCH,
                              "per_sample/BusyWait#2": BATCH, "collate/default_collate": 1})
    assert dataset.trace is None and collate.trace is None


def test_full_mode_adds_function_calls_from_every_process(session, tmp_path):
    s = session(mode="full", tracer_entries=50_000)
    dataset = TracedTiny()
    rec = s.start_main(dataset)  # the workers fork with the main's profiler hook running: they stop it
    pids = _consume(_loader(s, "fork", dataset=dataset), rec)
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
    rec = s.worker_init(0)
    now = time.perf_counter_ns()
    for i in range(kept):
        rec.add("kept", now + i, now + i + 1)
    rec.flush()  # what the periodic flush does every flush_interval_s
    for i in range(lost):
        rec.add("lost", now + i, now + i + 1)
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


def test_recorders_never_travel_in_pickles(session, tmp_path):
    s = session(flush_interval_s=0.5)
    dataset = InstrumentedDataset(TinyBase(), [BusyWait(0.0)])
    collate = TimedCollate([])
    rec = s.start_main(dataset, collate)
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(rec)
    clone = pickle.loads(pickle.dumps(s))
    assert clone.work_dir == s.work_dir and clone.flush_interval_s == 0.5 and clone._main is None
    for obj in (dataset, collate, WorkerInit(None, s)):
        pickle.loads(pickle.dumps(obj))
    assert pickle.loads(pickle.dumps(dataset)).trace is None
    assert pickle.loads(pickle.dumps(collate)).trace is None
    assert dataset.trace is rec and collate.trace is rec, "pickling leaves the originals alone"
    s.finish(tmp_path)


def test_bad_mode_is_one_line_error():
    with pytest.raises(viztrace.VizTraceError, match="mode must be one of sparse, full"):
        VizTraceSession(mode="everything")
