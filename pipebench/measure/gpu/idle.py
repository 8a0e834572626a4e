"""GPU busy % and the idle-time breakdown of a torch.profiler CUDA trace, by HTA's documented rule.

Holistic Trace Analysis ("Idle Time Breakdown"; `_analyze_idle_time_for_stream` in
hta/analyzers/breakdown_analysis.py, traceinsight 0.6.1): per CUDA stream, the gap before each GPU
event (kernel, memcpy, memset) is idle time, classified as

1. **host wait** when the host call that launched the event (matched by correlation id) started
   after the previous event ended: the CPU did not enqueue work fast enough;
2. **kernel wait** otherwise when the gap is below `consecutive_kernel_delay` (30 ns): the
   overhead of launching back-to-back kernels;
3. **other** otherwise (e.g. cross-stream event waits).

HTA itself is not a dependency: traceinsight pulls in jupyterlab, pandas and plotly for ~40 lines
of rule. Shares are of the classified idle time, summed over streams (HTA's `idle_time_ratio`);
`gpu_busy_pct`, the union of GPU activity over the whole window, covers the unclassified ends.
"""

from collections import defaultdict
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from pipebench.measure.gpu.trace import TraceEvent, gpu_events, launches_by_correlation

# HTA's default `consecutive_kernel_delay`: back-to-back kernels closer than this are "kernel wait".
CONSECUTIVE_KERNEL_DELAY_NS = 30
HOST_WAIT, KERNEL_WAIT, OTHER = "host_wait", "kernel_wait", "other"
IDLE_CATEGORIES = (HOST_WAIT, KERNEL_WAIT, OTHER)


@dataclass(frozen=True)
class IdleBreakdown:
    """GPU time use over a window. `*_pct` of idle are shares of the classified idle time (sum 100)."""

    window_ms: float
    busy_ms: float
    gpu_busy_pct: float
    idle_ms: Dict[str, float]
    idle_pct: Dict[str, Optional[float]]
    gpu_events: int
    streams: Tuple[int, ...]


def classify_gaps(events: Sequence[TraceEvent], launches: Dict[int, TraceEvent],
                  consecutive_kernel_delay_ns: int = CONSECUTIVE_KERNEL_DELAY_NS) -> List[Tuple[str, int]]:
    """(category, idle ns) for each gap between consecutive GPU events of one stream (HTA's rule)."""
    ordered = sorted(events, key=lambda e: e.start_ns)
    gaps = []
    for prev, cur in zip(ordered, ordered[1:]):
        idle = cur.start_ns - prev.end_ns
        launch = launches.get(cur.correlation)
        if launch is not None and launch.start_ns > prev.end_ns:
            category = HOST_WAIT
        elif idle < consecutive_kernel_delay_ns:
            category = KERNEL_WAIT
        else:
            category = OTHER
        gaps.append((category, idle))
    return gaps


def _union_ns(intervals: List[Tuple[int, int]]) -> int:
    total, end = 0, float("-inf")
    for lo, hi in sorted(intervals):
        total += max(hi - max(lo, end), 0)
        end = max(end, hi)
    return total


def idle_breakdown(events: Sequence[TraceEvent], window: Optional[Tuple[int, int]] = None,
                   consecutive_kernel_delay_ns: int = CONSECUTIVE_KERNEL_DELAY_NS) -> IdleBreakdown:
    """Busy % of `window` (ns; default: first to last GPU event) and the idle breakdown of the GPU
    events that start inside it, so a trace can be cut to exactly its profiled steps."""
    on_gpu = gpu_events(events)
    if window is None:
        window = (min((e.start_ns for e in on_gpu), default=0), max((e.end_ns for e in on_gpu), default=0))
    lo, hi = window
    inside = [e for e in on_gpu if lo <= e.start_ns < hi]
    launches = launches_by_correlation(events)
    by_stream: Dict[int, List[TraceEvent]] = defaultdict(list)
    for e in inside:
        by_stream[e.stream].append(e)
    idle_ns = dict.fromkeys(IDLE_CATEGORIES, 0)
    for stream_events in by_stream.values():
        for category, gap in classify_gaps(stream_events, launches, consecutive_kernel_delay_ns):
            idle_ns[category] += gap
    busy = _union_ns([(e.start_ns, min(e.end_ns, hi)) for e in inside])
    total_idle = sum(idle_ns.values())
    window_ns = hi - lo
    return IdleBreakdown(
        window_ms=window_ns / 1e6,
        busy_ms=busy / 1e6,
        gpu_busy_pct=100.0 * busy / window_ns if window_ns > 0 else float("nan"),
        idle_ms={k: v / 1e6 for k, v in idle_ns.items()},
        idle_pct={k: (100.0 * v / total_idle if total_idle > 0 else None) for k, v in idle_ns.items()},
        gpu_events=len(inside),
        streams=tuple(sorted(by_stream)),
    )
