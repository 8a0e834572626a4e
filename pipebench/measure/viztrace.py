"""One Perfetto-loadable timeline of the main process and every DataLoader worker (trace=viztracer).

Three facts, measured against VizTracer 1.1.1, shape it:

* An inline ``VizTracer(...)`` follows only its own process. A forked worker inherits the hook and
  a copy of the buffer that nobody saves; spawn/forkserver workers are not traced at all. Only the
  ``viztracer`` CLI follows children (``install_all_hooks``) and merges their files.
* torch's worker SIGTERM handler ``_exit(0)``s when the parent shuts a worker down: no finaliser
  runs, so a tracer that saves "at exit" loses everything. Persistent workers end exactly so, and
  so does a worker whose exit-save outlasts DataLoader's 5 s join.
* VizTracer's custom events cost about 8 µs each to log and 9 to 16 µs to save: too dear for one
  slice per step per sample by default.

So each process keeps its own `Recorder` (``start_main`` in the main process, ``worker_init`` as
the DataLoader ``worker_init_fn``). ``sparse`` records one slice per timed step from the chain's
``perf_counter_ns`` stamps (CLOCK_MONOTONIC, VizTracer's own time base on Linux). Each process
writes its slices in parts every ``flush_interval_s``, at a clean exit and on request (SIGUSR2 from
``finish``); ``full`` also runs a bounded VizTracer in each process. ``finish`` waits a bounded time
for the workers, then merges every part with VizTracer's ``ReportBuilder`` into ``viztrace.json``. A
killed worker loses at most its last ``flush_interval_s``, and nothing waits without a deadline.

There is no module-level state: a process's recorder hangs on that process's pipeline objects as
their ``trace`` attribute (None: not tracing). The session is picklable; a recorder never is.
"""

import json
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from multiprocessing.util import Finalize
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import psutil

from pipebench.base.errors import PipebenchError
from pipebench.base.io import replacing, write_bytes_atomic
from pipebench.base.typed_json import parse
from pipebench.measure.gpu.trace import ChromeEvent, ChromeTrace

TRACE_FILE = "viztrace.json"
MODES = ("sparse", "full")
# Slice category in the trace, so Perfetto can filter pipebench's step slices from VizTracer's.
CATEGORY = "pipebench"

# A worker writes what it has at least this often, so a worker killed by its parent loses at most
# this much of its timeline; one flush of a second of slices costs well under a millisecond.
DEFAULT_FLUSH_INTERVAL_S = 1.0
# How long finish() waits for the workers' last parts: twice DataLoader's own 5 s join.
DEFAULT_FINISH_TIMEOUT_S = 10.0
# Slices kept per process; beyond it they are counted as dropped, not stored. About 130 bytes of
# JSON each, so the merged trace stays loadable in the Perfetto UI.
DEFAULT_MAX_EVENTS = 250_000
# full mode: VizTracer's ring buffer per process (the newest entries kept), and a stack-depth cut
# that keeps the worker loop, the dataset and the transforms but drops deep library internals.
DEFAULT_TRACER_ENTRIES = 300_000
DEFAULT_MAX_STACK_DEPTH = 30
# The signal finish() sends a live worker to make it write what it has (persistent workers).
FLUSH_SIGNAL = getattr(signal, "SIGUSR2", None)
# How often finish() looks at the workers' markers while it waits.
POLL_S = 0.05

_MARKER_SUFFIX = ".open"
_PART_SUFFIX = ".pkl"
_VIZ_SUFFIX = ".viz.json"


class VizTraceError(PipebenchError):
    """trace=viztracer cannot run here; the message says why in one line."""


@dataclass(frozen=True)
class Marker:
    """A live worker's marker file: who it is (its process's create time, so finish() signals no
    stranger that reused the pid) and when it last flushed on request (0: not yet)."""

    pid: int
    worker_id: Optional[int]
    role: str
    create_time: Optional[float]
    flushed_ns: int


@dataclass(frozen=True)
class Part:
    """One flush of one process: its slices (name, start ns, end ns, OS thread id), its threads'
    names by OS thread id, and how many slices it has dropped so far."""

    pid: int
    role: str
    worker_id: Optional[int]
    events: List[Tuple[str, int, int, int]]
    threads: Mapping[int, str]
    dropped: int


@dataclass(frozen=True)
class ProcessSlices:
    """What one process left in the merged trace, over all its parts."""

    role: str
    worker_id: Optional[int]
    slices: int = 0
    dropped: int = 0
    threads: Mapping[int, str] = field(default_factory=dict)

    def add(self, part: Part) -> "ProcessSlices":
        return ProcessSlices(self.role, self.worker_id, self.slices + len(part.events),
                             max(self.dropped, part.dropped), {**self.threads, **part.threads})


_get_ident = threading.get_ident


def _stop_inherited(recorders: Any) -> None:
    """In a forked child: a recorder copied from the parent would never be saved and would
    attribute the parent's events to the child; in full mode its profiler hook is still running
    in this thread, so stop it."""
    pid = os.getpid()
    for rec in recorders:
        if isinstance(rec, Recorder) and rec.pid != pid and rec.tracer is not None:
            with suppress(Exception):  # never let tracing break a worker
                rec.tracer.stop()


def _attach(targets: Sequence[Any], rec: "Optional[Recorder]") -> None:
    for target in targets:
        target.trace = rec


def _process_create_time(pid: int) -> Optional[float]:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.create_time()
    except (psutil.Error, OSError):
        return None


class Recorder:
    """Slices of one process, written to `work_dir` in parts at defined points."""

    def __init__(self, session: "VizTraceSession", role: str, worker_id: Optional[int]) -> None:
        self.pid = os.getpid()
        self.role = role
        self.worker_id = worker_id
        self.tag = "main" if worker_id is None else f"w{worker_id}"
        self.work_dir = Path(session.work_dir)
        self.max_events = session.max_events
        self.events: List[Tuple[str, int, int, int]] = []
        self.kept = 0
        self.dropped = 0
        self.seq = 0
        self.closed = False
        self._busy = False
        self._requested = False
        self.interval_ns = int(session.flush_interval_s * 1e9)
        self.next_flush_ns = time.perf_counter_ns() + self.interval_ns
        self.tracer = _make_tracer(session, role) if session.mode == "full" else None

    def __reduce__(self):
        raise TypeError("a viztrace recorder belongs to one process and is never pickled; "
                        "drop it from the pickled state (the chain objects do, in __getstate__)")

    # The hot path: one tuple per slice (about 0.25 us). The thread is named by its ident, which
    # is cheap to read; flush() maps it to the OS thread id (get_native_id() is a syscall).
    def add(self, name: str, start_ns: int, end_ns: int) -> None:
        self.events.append((name, start_ns, end_ns, _get_ident()))
        if end_ns >= self.next_flush_ns:
            self.flush()

    @property
    def marker(self) -> Path:
        return self.work_dir / f"{self.tag}-{self.pid}{_MARKER_SUFFIX}"

    def _write_marker(self, flushed_ns: int) -> None:
        """Announce a live worker to finish(): who it is, to signal it safely, and its last flush."""
        info = Marker(self.pid, self.worker_id, self.role, _process_create_time(self.pid), flushed_ns)
        write_bytes_atomic(self.marker, json.dumps(asdict(info)).encode())

    def flush(self, final: bool = False, full_tracer: bool = False) -> None:
        """Write the slices gathered so far as one part (and the VizTracer buffer if asked)."""
        if os.getpid() != self.pid or self.closed:
            return  # an inherited copy, or already closed: nothing of ours to write
        if self._busy:  # re-entered from the flush signal's handler: answer_request() handles it
            return
        self._busy = True
        try:
            self.next_flush_ns = time.perf_counter_ns() + self.interval_ns
            n = len(self.events)
            if n or final:
                chunk = self.events[:n]
                # Same list object, so an add() interrupted by the flush signal keeps its slice.
                del self.events[:n]
                room = max(0, self.max_events - self.kept)
                if n > room:
                    self.dropped += n - room
                    chunk = chunk[:room]
                self.kept += len(chunk)
                live = [t for t in threading.enumerate() if t.native_id is not None]
                # ident -> OS thread id; a thread gone since its slices falls back to the process id.
                tids = {t.ident: t.native_id for t in live}
                chunk = [(name, start, end, tids.get(ident, self.pid)) for name, start, end, ident in chunk]
                threads = {t.native_id: t.name for t in live}
                part = Part(self.pid, self.role, self.worker_id, chunk, threads, self.dropped)
                path = self.work_dir / f"{self.tag}-{self.pid}-{self.seq:06d}{_PART_SUFFIX}"
                self.seq += 1
                write_bytes_atomic(path, pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))
            if self.tracer is not None and (final or full_tracer):
                self._dump_tracer(restart=not final)
        except Exception:
            pass  # the folder is gone (finish() already merged), the disk is full...: never raise
        finally:
            self._busy = False
        if self._requested and not final:
            self._requested = False
            self.answer_request()

    def _dump_tracer(self, restart: bool) -> None:
        tracer = self.tracer
        tracer.stop()
        path = self.work_dir / f"{self.tag}-{self.pid}-{self.seq:06d}{_VIZ_SUFFIX}"
        self.seq += 1
        with replacing(path) as tmp:
            tracer.dump(str(tmp))  # VizTracer's C writer: well under a microsecond per entry
        if restart:
            tracer.start()

    def answer_request(self) -> None:
        """A flush asked for by finish(): write everything, then say so in the marker. If the
        request lands inside a flush, that flush answers it when it is done."""
        if os.getpid() != self.pid or self.closed:
            return
        if self._busy:
            self._requested = True
            return
        self.flush(full_tracer=True)
        with suppress(OSError):
            self._write_marker(flushed_ns=time.perf_counter_ns())

    def close(self) -> None:
        """Last flush of this process; removes the marker so finish() stops waiting for it."""
        if os.getpid() != self.pid or self.closed:
            return
        self.flush(final=True)
        self.closed = True
        with suppress(OSError):
            self.marker.unlink()


def _make_tracer(session: "VizTraceSession", role: str):
    from viztracer import VizTracer  # imported only where full mode is used

    return VizTracer(
        tracer_entries=session.tracer_entries,
        verbose=0,
        max_stack_depth=session.max_stack_depth,
        ignore_c_function=True,  # C calls would multiply the event count and the per-call cost
        ignore_frozen=True,
        log_func_args=False,
        log_func_retval=False,
        register_global=False,
        process_name=f"pipebench {role}",
    )


@dataclass
class VizTraceSession:
    """One traced job. Picklable (plain fields only), so it can ride to spawn/forkserver workers
    as, or inside, the DataLoader's `worker_init_fn`; calling it is `worker_init`."""

    mode: str = "sparse"
    work_dir: Optional[str] = None
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S
    finish_timeout_s: float = DEFAULT_FINISH_TIMEOUT_S
    max_events: int = DEFAULT_MAX_EVENTS
    tracer_entries: int = DEFAULT_TRACER_ENTRIES
    max_stack_depth: int = DEFAULT_MAX_STACK_DEPTH
    main_pid: int = field(default_factory=os.getpid)
    # Filled by finish(): what was merged, and which workers lost part of their timeline.
    summary: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise VizTraceError(f"viztracer trace mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.flush_interval_s <= 0 or self.finish_timeout_s < 0 or self.max_events <= 0:
            raise VizTraceError("viztracer flush_interval_s and max_events must be > 0, finish_timeout_s >= 0")
        if self.work_dir is None:
            self.work_dir = tempfile.mkdtemp(prefix="pipebench-viztrace-")
        Path(self.work_dir).mkdir(parents=True, exist_ok=True)
        self._main: Optional[Recorder] = None  # the main process's recorder, between start_main and finish
        self._targets: List[Any] = []  # the main-process objects start_main() hung it on

    # A recorder is process-local: the session travels to spawn/forkserver workers without it.
    def __getstate__(self) -> Dict[str, Any]:
        return {**self.__dict__, "_main": None, "_targets": []}

    def start_main(self, *targets: Any) -> Recorder:
        """Start recording in the main process (and its VizTracer in full mode): the recorder is every
        target's `trace` until finish(); a worker forked after this replaces it with its own."""
        if os.getpid() != self.main_pid:
            raise VizTraceError("start_main() must run in the process that made the session")
        if self._main is not None:
            raise VizTraceError("start_main() already ran for this session")
        if self.mode == "full" and sys.getprofile() is not None:
            raise VizTraceError("trace=viztracer full mode needs Python's profiler hook, but another profiler "
                                "(or the viztracer CLI) already holds it; use the sparse mode or run without it")
        rec = Recorder(self, "main", None)
        self._main = rec
        self._targets = list(targets)
        _attach(targets, rec)
        if rec.tracer is not None:
            rec.tracer.start()
        return rec

    def worker_init(self, worker_id: int, *targets: Any) -> Optional[Recorder]:
        """DataLoader `worker_init_fn` body: this worker's recorder as every target's `trace` (by default
        the worker's dataset copy). None where it cannot trace: it never raises, so the worker still
        loads data, and finish() reports it as missing."""
        if not targets:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            targets = (info.dataset,) if info is not None else ()
        # A forked worker holds the parent's recorder (on the session and on the targets): take it
        # off before anything else, so not one sample is recorded into the parent's copy.
        inherited = [self._main, *(getattr(target, "trace", None) for target in targets)]
        if self._main is not None and self._main.pid != os.getpid():
            self._main = None
            self._targets = []
        _attach(targets, None)
        _stop_inherited(inherited)
        try:
            rec = Recorder(self, f"worker {worker_id}", worker_id)
            if FLUSH_SIGNAL is not None and threading.current_thread() is threading.main_thread():
                signal.signal(FLUSH_SIGNAL, lambda signum, frame: rec.answer_request())
            # Runs in multiprocessing's exit path after the worker loop returns (a clean shutdown);
            # a worker killed by its parent skips it and keeps only its periodic parts.
            Finalize(None, rec.close, exitpriority=100)
            rec._write_marker(flushed_ns=0)  # finish() signals only workers with a marker
            if rec.tracer is not None:
                rec.tracer.start()
        except Exception as exc:  # tracing must never break the benchmark
            print(f"pipebench: viztracer disabled in worker {worker_id}: {exc}", file=sys.stderr)
            return None
        _attach(targets, rec)
        return rec

    __call__ = worker_init

    def finish(self, job_dir: Path, timeout_s: Optional[float] = None) -> Path:
        """Stop the main recorder, collect the workers' parts (bounded wait), merge them into
        `job_dir/viztrace.json` and return its path. Workers still alive (persistent) are asked to
        flush and keep running; what they record afterwards is not in the trace."""
        if os.getpid() != self.main_pid:
            raise VizTraceError("finish() must run in the process that made the session")
        if self.summary:
            raise VizTraceError("finish() already ran for this session")
        rec, self._main = self._main, None
        if rec is not None:
            for target in self._targets:
                if getattr(target, "trace", None) is rec:
                    target.trace = None
            self._targets = []
            rec.close()
            if rec.tracer is not None:
                rec.tracer.stop()
        deadline = time.monotonic() + (self.finish_timeout_s if timeout_s is None else timeout_s)
        out = Path(job_dir) / TRACE_FILE
        self.summary = self._merge(out, self._settle_workers(deadline))
        shutil.rmtree(self.work_dir, ignore_errors=True)
        return out

    def _settle_workers(self, deadline: float) -> Dict[int, str]:
        """Wait, never past `deadline`, until every worker exited cleanly (marker gone), answered a
        flush request or died; pid -> state for those that did not exit cleanly."""
        work = Path(self.work_dir)
        asked_ns = time.perf_counter_ns()
        signalled: Dict[int, bool] = {}
        states: Dict[int, str] = {}
        while True:
            pending = []
            for marker in work.glob(f"*{_MARKER_SUFFIX}"):
                try:
                    info = parse(Marker, json.loads(marker.read_text()))
                except (OSError, ValueError):
                    continue  # removed or replaced while we read it; look again next round
                pid = info.pid
                created = _process_create_time(pid)
                if created is None or (info.create_time is not None and abs(created - info.create_time) > 0.05):
                    states[pid] = "killed: slices after its last periodic flush are lost"
                    continue
                if info.flushed_ns >= asked_ns:
                    states[pid] = "alive: flushed on request"
                    continue
                pending.append(pid)
                if not signalled.get(pid) and FLUSH_SIGNAL is not None:
                    with suppress(OSError):
                        os.kill(pid, FLUSH_SIGNAL)
                    signalled[pid] = True
            if not pending:
                return states
            if time.monotonic() >= deadline:
                for pid in pending:
                    states[pid] = "no answer before the deadline: only its periodic parts are in the trace"
                return states
            time.sleep(POLL_S)

    def _merge(self, out: Path, worker_states: Dict[int, str]) -> Dict[str, Any]:
        from viztracer.report_builder import ReportBuilder

        work = Path(self.work_dir)
        processes: Dict[int, ProcessSlices] = {}
        events: List[Dict[str, Any]] = []
        for path in sorted(work.glob(f"*{_PART_SUFFIX}")):
            try:
                part = pickle.loads(path.read_bytes())
            except Exception:
                continue
            pid = part.pid
            processes[pid] = processes.get(pid, ProcessSlices(part.role, part.worker_id)).add(part)
            for name, start, end, tid in part.events:
                events.append({"ph": "X", "cat": CATEGORY, "name": name, "pid": pid, "tid": tid,
                               "ts": start / 1000.0, "dur": (end - start) / 1000.0})
        viz_parts = []
        for path in sorted(work.glob(f"*{_VIZ_SUFFIX}")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            # "B" entries are calls still open when the buffer was dumped: no duration, no end.
            data["traceEvents"] = [e for e in parse(ChromeTrace, data).traceEvents if parse(ChromeEvent, e).ph != "B"]
            viz_parts.append(data)
        header = self._metadata_events(processes)
        summary = {
            "mode": self.mode,
            "main_pid": self.main_pid,
            "processes": {str(pid): {"role": p.role, "worker_id": p.worker_id, "slices": p.slices, "dropped": p.dropped}
                          for pid, p in sorted(processes.items())},
            "workers_not_closed": {str(pid): state for pid, state in sorted(worker_states.items())},
        }
        first = {"traceEvents": header + events, "otherData": {"pipebench_viztrace": summary}, "viztracer_metadata": {}}
        builder = ReportBuilder([first, *viz_parts], verbose=0)
        with replacing(out, ".json") as new:  # ReportBuilder picks the format by the suffix
            builder.save(output_file=str(new), file_info=False)
        return summary

    def _metadata_events(self, processes: Dict[int, ProcessSlices]) -> List[Dict[str, Any]]:
        """Process and thread names, main process first, workers by id."""
        meta = []
        for pid, proc in processes.items():
            is_main = proc.worker_id is None
            meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": pid,
                         "args": {"name": f"pipebench {proc.role}"}})
            meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid,
                         "args": {"sort_index": 0 if is_main else 1 + proc.worker_id}})
            for tid, name in proc.threads.items():
                meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        return meta
