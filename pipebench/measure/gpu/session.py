"""GPU-side truth for one job: what the GPU did while the loader fed it.

Over the measured steps, cheap readings only: the copy's GPU time (`DeviceCopy`), NVML utilisation
(`GpuUtilSampler`) and the caching allocator (`AllocatorTracker`). After them, on extra steps
(pipebench.measure.after_window): a short CPU+CUDA trace read for GPU busy %, HTA's idle split and
the consumer's syncs, and a live sync count on one held batch.

Off CUDA nothing here touches CUDA, and `gpu_notes` says why the GPU columns are empty.
Construction never touches CUDA (DataLoader workers may fork after it).
"""

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from pipebench.base.gpu_timing import DeviceCopy
from pipebench.measure.gpu.alloc_churn import AllocatorTracker
from pipebench.measure.gpu.idle import IDLE_CATEGORIES, IdleBreakdown, idle_breakdown
from pipebench.measure.gpu.sync_detect import (
    CONSUMER_LABEL,
    NO_CUDA_NOTE,
    SyncCount,
    count_sync_warnings,
    syncs_from_trace,
)
from pipebench.measure.gpu.trace import load_trace, windows
from pipebench.measure.gpu.util import GpuUtilSampler
from pipebench.measure.meter import Meter
from pipebench.measure.summarize import accel_util_pct
from pipebench.record.figures import Summary

# Steps in the GPU trace: a short trace, as HTA's guidance asks, yet several gaps per stream.
# Raised to two whole worker cycles: fewer steps than a cycle can fall inside one burst of
# ready batches and read the GPU as busy (89.6% on an H100 at 8 workers, against 23-25% for
# the job as NVML and accel_util_pct saw it).
GPU_TRACE_STEPS = 5
TRACE_CYCLES = 2
# The trace window's own accel_util_pct may differ from the job's by this many points before
# the row says the trace does not stand for the job's steady state.
TRACE_WINDOW_MAX_GAP_POINTS = 10.0
# Consumer steps run under set_sync_debug_mode("warn"): the count is per step, so a few suffice.
SYNC_PROBE_STEPS = 3
GPU_TRACE_FILE = "gpu_trace.json"
# record_function label around each whole step (wait + copy + consumer) in the GPU trace.
STEP_LABEL = "pipebench/step"
# Why the trace's columns are empty when no GPU trace pass ran.
NO_TRACE_NOTE = "no GPU trace (run.profile_steps=0): sync and idle columns not measured"


def _not_on_cuda_note() -> str:
    return "consumer not on CUDA" if torch.cuda.is_available() else NO_CUDA_NOTE


class LabelledConsumer:
    """A consumer whose steps are labelled CONSUMER_LABEL for the profiler; keeps the last batch."""

    def __init__(self, consumer: Any):
        self.consumer = consumer
        self.device = consumer.device
        self.last_batch: Optional[tuple] = None

    def step(self, data: Any, labels: Any) -> None:
        self.last_batch = (data, labels)
        with torch.profiler.record_function(CONSUMER_LABEL):
            self.consumer.step(data, labels)

    def report(self) -> Dict[str, Any]:
        return self.consumer.report()


def trace_steps(cycle: int) -> int:
    """Steps in the GPU trace: GPU_TRACE_STEPS, raised to TRACE_CYCLES whole worker cycles."""
    return max(-(-GPU_TRACE_STEPS // cycle), TRACE_CYCLES) * cycle


def trace_window_note(job_accel_pct: Optional[float], trace_accel_pct: Optional[float]) -> Optional[str]:
    """A note when the traced steps kept the GPU busier or idler than the measured window did."""
    if job_accel_pct is None or trace_accel_pct is None:
        return None
    if abs(trace_accel_pct - job_accel_pct) <= TRACE_WINDOW_MAX_GAP_POINTS:
        return None
    return (f"the GPU trace's steps had accel_util_pct {trace_accel_pct:.0f}% against the job's "
            f"{job_accel_pct:.0f}%: gpu_busy_pct and the idle split describe other steps than the window")


@dataclass(frozen=True)
class TracedFigures:
    """What the GPU trace pass read: its steps' own accel_util_pct, its file, HTA's idle split, and the
    syncs counted in the trace and live on the held batch."""

    trace_accel_util_pct: Optional[float]
    trace_steps: int
    trace: str
    idle: IdleBreakdown
    syncs: SyncCount
    syncs_live: SyncCount


class GpuSession(Meter):
    """Collects the GPU-side figures of one job (a Meter made of meters); see the module docstring."""

    key = "gpu"

    def __init__(self, consumer: Any, untraced_note: str = NO_TRACE_NOTE):
        self.consumer = consumer
        self.untraced_note = untraced_note
        device = getattr(consumer, "device", None)
        self.on_cuda = device is not None and device.type == "cuda"
        self.copier = DeviceCopy()
        self.util = GpuUtilSampler(enabled=self.on_cuda)
        self.alloc = AllocatorTracker(consumer.device if self.on_cuda else None)
        self._profiled: Optional[TracedFigures] = None
        self._parts = (self.util, self.alloc)

    def start(self) -> None:
        for part in self._parts:
            part.start()

    def mark(self, name: str) -> None:
        """The step loop's first/last measured-step marks: start and stop the readings."""
        for part in self._parts:
            part.mark(name)

    def stop(self) -> None:
        """Ends NVML sampling even when a pass was interrupted before its last mark."""
        for part in reversed(self._parts):
            part.stop()

    def read_trace(self, path: Path, traced: List[Any], last_batch: tuple) -> None:
        """Read the GPU trace pass's trace at `path` (pipebench.measure.after_window; `traced`: its
        steps): GPU busy %, HTA's idle breakdown and the syncs, then the sync probe on the pass's
        last batch. The trace's own accel_util_pct is kept to show that it stands for the window."""
        events = load_trace(path)
        steps = windows(events, STEP_LABEL)
        idle = idle_breakdown(events, (steps[0].start_ns, steps[-1].end_ns) if steps else None)
        data, labels = last_batch
        self._profiled = TracedFigures(accel_util_pct(traced), len(traced), path.name, idle, syncs_from_trace(events),
                                       count_sync_warnings(lambda: self.consumer.step(data, labels), SYNC_PROBE_STEPS))

    def columns(self) -> Dict[str, Any]:
        """The summary cells: figures where measured, None (an empty cell) where not, and why."""
        util = self.util.stop()
        notes = []
        if not self.on_cuda:
            notes.append(_not_on_cuda_note())
        else:
            if util.note:
                notes.append(f"gpu_util_pct {util.note}")
            if not self._profiled:
                notes.append(self.untraced_note)
        traced = self._profiled
        idle, syncs = (traced.idle, traced.syncs) if traced else (None, None)
        shares = idle.idle_pct if idle else dict.fromkeys(IDLE_CATEGORIES)
        return {
            "h2d_gpu_ms_median": float(np.median(self.copier.gpu_ms)) if self.copier.gpu_ms else None,
            **self.util.columns(),
            "syncs_per_step": syncs.per_step if syncs else None,
            "sync_ops": syncs.ops_text() if syncs else None,
            "sync_wait_ms_per_step": syncs.wait_ms / syncs.steps if syncs and syncs.steps else None,
            "gpu_busy_pct": idle.gpu_busy_pct if idle else None,
            "trace_accel_util_pct": traced.trace_accel_util_pct if traced else None,
            # idle_host_wait_pct, idle_kernel_wait_pct, idle_other_pct: each idle category's share
            **{f"idle_{category}_pct": shares[category] for category in IDLE_CATEGORIES},
            **self.alloc.columns(),
            "gpu_notes": "; ".join(notes) or None,
        }

    def record(self) -> Dict[str, Any]:
        """result.json's `gpu` section: everything behind the columns, raw series included."""
        traced = self._profiled
        return {
            "on_cuda": self.on_cuda,
            "h2d_gpu_ms": list(self.copier.gpu_ms),
            "util": self.util.record(),
            "allocator": self.alloc.record(),
            "trace": traced.trace if traced else None,
            "trace_steps": traced.trace_steps if traced else 0,
            "idle": asdict(traced.idle) if traced else None,
            "syncs_trace": asdict(traced.syncs) if traced else None,
            "syncs_live": {**asdict(traced.syncs_live), "per_step": traced.syncs_live.per_step} if traced else None,
            "note": None if self.on_cuda else _not_on_cuda_note(),
        }

    @staticmethod
    def notes(summary: Summary) -> Dict[str, str]:
        """`gpu_notes`: the GPU trace's accel_util_pct far from the row's (`trace_window_note`)."""
        line = trace_window_note(summary.accel_util_pct, summary.trace_accel_util_pct)
        return {"gpu_notes": line} if line else {}
