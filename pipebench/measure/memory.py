"""Worker memory health: RSS and PSS of the main process and each DataLoader worker, and /dev/shm.

Under a thread backend (threads, spdl) the workers are threads: the sums are the main process's
own. A background thread samples, and `mark()` samples at once, so the PSS growth between the first
and last measured step does not depend on the sampling interval.

PSS is the number that matters, not RSS: a forked worker's RSS already counts every page it shares
with the main process, so copy-on-read (refcounts written, pytorch issue #13246) leaves RSS flat
while each copied page raises PSS. Reading PSS (/proc/<pid>/smaps_rollup) walks the page tables:
about 7-10 ms of CPU per process once torch is imported.
"""

import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Collection, Dict, List, Optional, Tuple

import psutil

from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED, Meter

# multiprocessing's own helper processes: the resource tracker (started by the first spawn or
# forkserver loader, it lives as long as the main process, so a later loader's figures would count
# it as a worker) and the fork server. Neither holds the loader's data; both are left out.
HELPER_MODULES = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
# MiB, the unit top, free and ps use for memory.
BYTES_PER_MB = 1 << 20
# The processes left out are named, up to this many: enough to say what they are (a script's
# wandb-core, a subprocess it started), never a growing list in a long run.
LEFT_OUT_NAMED = 8

# A main process and 2 workers cost 35-45 ms of CPU a sample on the 2-core machine; 5 s keeps that
# under 1% of a core, and the marks, start and stop still take the readings that matter.
DEFAULT_INTERVAL_S = 5.0

# The most of one core the background thread may use: the gap is stretched to cost / this where
# the workers' number and pages make a sample dearer.
MAX_CPU_FRACTION = 0.01

# How long stop() waits for a sample in progress. A sample takes tens of ms. The thread is a
# daemon, so a stuck /proc read can never hold the benchmark after this.
JOIN_TIMEOUT_S = 5.0

SHM_PATH = "/dev/shm"

MAIN_LABEL = "main"
# The summary cells this meter owns, each a field of MemoryReport.
SUMMARY_CELLS = ("rss_mb_peak", "pss_mb_peak", "worker_pss_growth_mb", "shm_mb_peak")


@dataclass(frozen=True)
class ProcessMemory:
    """One process over the run. `pss_mb_at` maps mark names to PSS at that mark (None: unreadable)."""

    label: str
    pid: int
    samples: int
    rss_mb_peak: Optional[float]
    pss_mb_peak: Optional[float]
    pss_mb_at: Dict[str, Optional[float]]


@dataclass(frozen=True)
class MemoryReport:
    """The memory health of one run; None where /proc or /dev/shm could not be read.

    `rss_mb_peak` and `pss_mb_peak` peak the SUM over main + children at one sample, since the
    simultaneous total is what exhausts a machine (summed RSS overstates shared pages; PSS does not).
    `worker_pss_growth_mb`: PSS(LAST_MEASURED) - PSS(FIRST_MEASURED) summed over the children sampled
    at both marks (a worker respawned between them is not counted). `shm_mb_peak` is the machine-wide
    /dev/shm high-water mark less its value at start(). `left_out` names the children not counted
    (the first LEFT_OUT_NAMED), where the sampler was told the workers' pids.
    """

    interval_s: float
    duration_s: float
    samples: int
    sampling_cost_ms_mean: Optional[float]
    rss_mb_peak: Optional[float]
    pss_mb_peak: Optional[float]
    main_pss_growth_mb: Optional[float]
    worker_pss_growth_mb: Optional[float]
    shm_mb_start: Optional[float]
    shm_mb_peak: Optional[float]
    shm_mb_peak_abs: Optional[float]
    processes: Tuple[ProcessMemory, ...]
    left_out: Tuple[str, ...] = ()


# pid -> (rss bytes, pss bytes or None)
_Reading = Dict[int, Tuple[int, Optional[int]]]


class _Track:
    """Running peaks and mark values of one process."""

    def __init__(self, label: str):
        self.label = label
        self.samples = 0
        self.rss_peak: Optional[int] = None
        self.pss_peak: Optional[int] = None
        self.pss_at: Dict[str, Optional[int]] = {}


def _helper(proc: psutil.Process) -> bool:
    """Whether the process is one of multiprocessing's own helpers, not a worker."""
    try:
        return any(module in part for part in proc.cmdline() for module in HELPER_MODULES)
    except (psutil.Error, OSError):
        return False


def _processes(pid: int) -> List[psutil.Process]:
    """The main process and all its descendants but multiprocessing's helpers (`HELPER_MODULES`).
    Empty or partial where /proc can't be read."""
    try:
        main = psutil.Process(pid)
    except (psutil.Error, OSError):
        return []
    try:
        return [main, *(child for child in main.children(recursive=True) if not _helper(child))]
    except (psutil.Error, OSError):
        return [main]


def _name(proc: psutil.Process) -> str:
    """"name (pid N)" of a process, its name "?" where /proc no longer says."""
    try:
        name = proc.name()
    except (psutil.Error, OSError):
        name = "?"
    return f"{name} (pid {proc.pid})"


def _read(proc: psutil.Process) -> Optional[Tuple[int, Optional[int]]]:
    """(RSS, PSS) in bytes. PSS is None if smaps_rollup is denied. None if the process is gone."""
    try:
        full = proc.memory_full_info()
        rss, pss = full.rss, full.pss
    except psutil.AccessDenied:
        try:
            rss, pss = proc.memory_info().rss, None
        except (psutil.Error, OSError):
            return None
    except (psutil.Error, OSError):  # NoSuchProcess, ZombieProcess, or /proc missing
        return None
    # A zombie (exited, not yet reaped) reads as all zeros. It is gone, so don't record it.
    return None if rss == 0 else (rss, pss)


def _shared_pss(pid: int) -> Optional[int]:
    """Bytes of PSS `pid` holds in pages it shares (PSS less USS); None where it can't be read."""
    try:
        full = psutil.Process(pid).memory_full_info()
    except (psutil.Error, OSError):
        return None
    return full.pss - full.uss


def _shm_used() -> Optional[int]:
    try:
        return shutil.disk_usage(SHM_PATH).used
    except OSError:
        return None


def _mb(value: Optional[int]) -> Optional[float]:
    return None if value is None else value / BYTES_PER_MB


def _max(current: Optional[int], value: Optional[int]) -> Optional[int]:
    return max((v for v in (current, value) if v is not None), default=None)


def _growth(tracks: List[_Track]) -> Optional[float]:
    """Sum of PSS(LAST_MEASURED) - PSS(FIRST_MEASURED) over the tracks that have both marks."""
    deltas = [
        t.pss_at[LAST_MEASURED] - t.pss_at[FIRST_MEASURED]
        for t in tracks
        if t.pss_at.get(FIRST_MEASURED) is not None and t.pss_at.get(LAST_MEASURED) is not None
    ]
    return _mb(sum(deltas)) if deltas else None


class MemorySampler(Meter):
    """Sample RSS/PSS of this process and its children, and /dev/shm, on a daemon thread (a Meter).

    start() and stop() each take a sample; a `with` block stops the thread even on an exception.
    `interval_s` is stretched when one sample would cost more than `max_cpu_fraction` of a core.
    `forked_from`: the process this one was forked from (a sweep's job process): its share of the
    pages they share (PSS less USS) counts as ours, as a fresh interpreter would own them alone;
    without it a job's PSS read 150-240 MB low. `workers`: where given, a live collection of the
    only children counted (a watched loader's); any other child (a service the user's script
    started) is named in `left_out`.
    """

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, max_cpu_fraction: float = MAX_CPU_FRACTION,
                 forked_from: Optional[int] = None, workers: Optional[Collection[int]] = None):
        if interval_s <= 0 or not 0 < max_cpu_fraction <= 1:
            raise ValueError(
                f"need interval_s > 0 and 0 < max_cpu_fraction <= 1, got {interval_s}, {max_cpu_fraction}"
            )
        self.interval_s = interval_s
        self.max_cpu_fraction = max_cpu_fraction
        self._pid = os.getpid()
        self._forked_from = forked_from
        self._workers = workers
        self._left_out: Dict[int, str] = {}
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._halted = False
        self._started_at = 0.0
        self._duration_s = 0.0
        self._tracks: Dict[int, _Track] = {}
        self._children_seen = 0
        self._samples = 0
        self._cost_s_total = 0.0
        self._rss_sum_peak: Optional[int] = None
        self._pss_sum_peak: Optional[int] = None
        self._shm_start: Optional[int] = None
        self._shm_peak: Optional[int] = None
        self._report: Optional[MemoryReport] = None

    key = "memory"
    holds_loop = True  # half a second of page-table walks at 8 workers on the 2-core machine

    def __enter__(self) -> "MemorySampler":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._halt()

    @property
    def samples(self) -> int:
        """Samples taken so far (background, marks, start and stop)."""
        with self._lock:
            return self._samples

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("a MemorySampler can be started only once")
        self._started_at = time.perf_counter()
        self._sample(None)
        self._thread = threading.Thread(target=self._run, name="pipebench-memory-sampler", daemon=True)
        self._thread.start()

    def mark(self, name: str) -> None:
        """Take a sample now, tagged `name`. If a name is used twice, the later sample wins."""
        if self._thread is None or self._halted:
            raise RuntimeError("mark() needs a started, not yet stopped MemorySampler")
        self._sample(name)

    def stop(self) -> MemoryReport:
        """Stop the thread and report (kept for columns() and record())."""
        self._halt()
        with self._lock:
            tracks = list(self._tracks.items())
            self._report = MemoryReport(
                interval_s=self.interval_s,
                duration_s=self._duration_s,
                samples=self._samples,
                sampling_cost_ms_mean=self._cost_s_total / self._samples * 1e3 if self._samples else None,
                rss_mb_peak=_mb(self._rss_sum_peak),
                pss_mb_peak=_mb(self._pss_sum_peak),
                main_pss_growth_mb=_growth([t for pid, t in tracks if pid == self._pid]),
                worker_pss_growth_mb=_growth([t for pid, t in tracks if pid != self._pid]),
                shm_mb_start=_mb(self._shm_start),
                shm_mb_peak=_mb(None if self._shm_peak is None else self._shm_peak - self._shm_start),
                shm_mb_peak_abs=_mb(self._shm_peak),
                processes=tuple(
                    ProcessMemory(
                        label=t.label,
                        pid=pid,
                        samples=t.samples,
                        rss_mb_peak=_mb(t.rss_peak),
                        pss_mb_peak=_mb(t.pss_peak),
                        pss_mb_at={mark: _mb(v) for mark, v in t.pss_at.items()},
                    )
                    for pid, t in tracks
                ),
                left_out=tuple(self._left_out.values()),
            )
            return self._report

    def processes_pss(self, pids: Collection[int]) -> Tuple[Optional[float], Optional[float]]:
        """Of the processes `pids` alone (one loader's workers among several loaders'): their summed
        PSS at LAST_MEASURED and their growth by `worker_pss_growth_mb`'s rule; None where none was read."""
        with self._lock:
            tracks = [track for pid, track in self._tracks.items() if pid in pids]
        last = [t.pss_at[LAST_MEASURED] for t in tracks if t.pss_at.get(LAST_MEASURED) is not None]
        return (_mb(sum(last)) if last else None), _growth(tracks)

    def columns(self) -> Dict[str, Optional[float]]:
        return {column: getattr(self._report, column, None) for column in SUMMARY_CELLS}

    def record(self) -> Dict[str, Any]:
        return asdict(self._report) if self._report else {}

    def _halt(self) -> None:
        """Stop the thread and take the final sample, once."""
        if self._thread is None or self._halted:
            return
        self._stop_event.set()
        self._thread.join(JOIN_TIMEOUT_S)
        self._sample(None)
        self._halted = True
        self._duration_s = time.perf_counter() - self._started_at

    def _run(self) -> None:
        gap = self.interval_s
        while not self._stop_event.wait(gap):
            cost_s = self._sample(None)
            gap = max(self.interval_s, cost_s / self.max_cpu_fraction)

    def _sample(self, mark: Optional[str]) -> float:
        """Read every process and /dev/shm, fold the reading into the running peaks, return its CPU cost."""
        cpu_start = time.thread_time()
        reading: _Reading = {}
        for proc in self._counted(_processes(self._pid)):
            value = _read(proc)
            if value is not None:
                reading[proc.pid] = value
        if self._forked_from is not None and reading.get(self._pid, (0, None))[1] is not None:
            share = _shared_pss(self._forked_from)
            rss, pss = reading[self._pid]
            reading[self._pid] = (rss, None if share is None else pss + share)
        shm = _shm_used()
        cost_s = time.thread_time() - cpu_start
        with self._lock:
            self._record(reading, shm, mark, cost_s)
        return cost_s

    def _counted(self, processes: List[psutil.Process]) -> List[psutil.Process]:
        """The processes to read: all of them, or the main process and the workers named in
        `workers`, the others named in `left_out` (the first LEFT_OUT_NAMED)."""
        if self._workers is None:
            return processes
        workers = frozenset(self._workers)  # one copy: the loop's thread adds to it as workers start
        counted: List[psutil.Process] = []
        left: List[psutil.Process] = []
        for proc in processes:
            (counted if proc.pid == self._pid or proc.pid in workers else left).append(proc)
        with self._lock:
            for proc in left:
                if proc.pid not in self._left_out and len(self._left_out) < LEFT_OUT_NAMED:
                    self._left_out[proc.pid] = _name(proc)
        return counted

    def _record(self, reading: _Reading, shm: Optional[int], mark: Optional[str], cost_s: float) -> None:
        self._samples += 1
        self._cost_s_total += cost_s
        for pid, (rss, pss) in reading.items():
            track = self._tracks.get(pid)
            if track is None:
                if pid == self._pid:
                    label = MAIN_LABEL
                else:
                    label = f"worker_{self._children_seen}"
                    self._children_seen += 1
                track = self._tracks[pid] = _Track(label)
            track.samples += 1
            track.rss_peak = _max(track.rss_peak, rss)
            track.pss_peak = _max(track.pss_peak, pss)
            if mark is not None:
                track.pss_at[mark] = pss
        if reading:
            self._rss_sum_peak = _max(self._rss_sum_peak, sum(rss for rss, _ in reading.values()))
            pss_values = [pss for _, pss in reading.values()]
            # A partial sum would pass for a total, so a sample counts only if every PSS was read.
            if None not in pss_values:
                self._pss_sum_peak = _max(self._pss_sum_peak, sum(pss_values))
        if shm is not None:
            if self._shm_start is None:
                self._shm_start = shm
            self._shm_peak = _max(self._shm_peak, shm)
