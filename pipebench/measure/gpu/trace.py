"""Read a torch.profiler Chrome trace into the few event kinds the GPU analyses need.

torch.profiler (Kineto) writes complete events (`"ph": "X"`, `ts`/`dur` in µs): GPU activity
(kernels, memcpys, memsets, with `args.stream` and `args.correlation`), the host calls that
launched them (runtime or driver, the same `args.correlation`), host operators (`cpu_op`) and
record_function labels (`user_annotation`). Times are kept in integer ns, as Holistic Trace
Analysis converts them.
"""

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from pipebench.base.typed_json import parse

NS_PER_US = 1000
# GPU-side categories that occupy a stream; HTA 0.6.1's idle breakdown takes the same set
# (kernels, copies and memsets; never its synthetic "cuda_sync" category).
GPU_CATEGORIES = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"})
# Host-side categories whose events carry the correlation id of the GPU work they enqueue.
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "Driver"})
CPU_OP_CATEGORY = "cpu_op"
ANNOTATION_CATEGORY = "user_annotation"


@dataclass(frozen=True)
class ChromeEvent:
    """One event as a Chrome trace stores it (`ts` and `dur` in µs), the keys the analyses read."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: Optional[float] = None
    dur: float = 0
    pid: Any = None
    tid: Any = None
    args: Optional[Mapping[str, Any]] = None


@dataclass(frozen=True)
class ChromeTrace:
    """A Chrome trace file's object: its events, as stored."""

    traceEvents: Tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class EventArgs:
    """What the analyses read of an event's `args`: its stream, and the id tying a launch to its GPU work."""

    stream: Optional[int] = None
    correlation: Optional[int] = None


@dataclass(frozen=True)
class TraceEvent:
    """One complete ("X") event, times in ns."""

    cat: str
    name: str
    start_ns: int
    dur_ns: int
    pid: Any
    tid: Any
    stream: Optional[int] = None
    correlation: Optional[int] = None

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns

    def contains(self, other: "TraceEvent") -> bool:
        return self.start_ns <= other.start_ns and other.end_ns <= self.end_ns


def _to_ns(value: Any) -> int:
    return int(round(float(value) * NS_PER_US))


def _complete(e: ChromeEvent) -> TraceEvent:
    args = parse(EventArgs, e.args)
    return TraceEvent(str(e.cat), str(e.name), _to_ns(e.ts), _to_ns(e.dur), e.pid, e.tid, args.stream,
                      args.correlation)


def load_trace(source: Union[str, Path, Mapping[str, Any], Sequence[Mapping[str, Any]]]) -> List[TraceEvent]:
    """The complete events, sorted by start, of a trace file (.json or .json.gz), a loaded trace
    object ({"traceEvents": [...]}) or a bare event list; flow, metadata and counters dropped."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        source = json.loads(text)
    raw = parse(ChromeTrace, source).traceEvents if isinstance(source, Mapping) else source
    stored = (parse(ChromeEvent, e) for e in raw)
    events = [_complete(e) for e in stored if e.ph == "X" and e.ts is not None]
    return sorted(events, key=lambda e: (e.start_ns, -e.dur_ns))


def gpu_events(events: Sequence[TraceEvent]) -> List[TraceEvent]:
    """Kernels, copies and memsets that ran on a stream."""
    return [e for e in events if e.cat in GPU_CATEGORIES and e.stream is not None]


def launches_by_correlation(events: Sequence[TraceEvent]) -> Dict[int, TraceEvent]:
    """Host launch call (runtime or driver) for each correlation id."""
    return {e.correlation: e for e in events if e.cat in LAUNCH_CATEGORIES and e.correlation is not None}


def windows(events: Sequence[TraceEvent], label: str) -> List[TraceEvent]:
    """The host-side user annotations (record_function) named `label`, in time order."""
    return [e for e in events if e.cat == ANNOTATION_CATEGORY and e.name == label]
