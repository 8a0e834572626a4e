"""Host-device synchronisations in the consumer step: counted, timed and named by the op that made them.

Two independent counts, both taken on extra steps after the measured ones (never inside them):

- **From a profiler trace** (`syncs_from_trace`): a host call in `SYNC_CALLS` inside a consumer
  step (`CONSUMER_LABEL`) *under an operator*, named by the outermost and innermost operators
  around it ("aten::index > aten::nonzero"). Syncs under no operator are the harness's own,
  deliberate ones (CUDA-event timing) and are not counted.
- **Live** (`count_sync_warnings`): under torch.cuda.set_sync_debug_mode("warn") every
  synchronising CUDA call warns; each is counted and located by the Python line that made it.
"""

import linecache
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence

import torch

from pipebench.measure.gpu.trace import (
    CPU_OP_CATEGORY,
    LAUNCH_CATEGORIES,
    TraceEvent,
    windows,
)

# record_function label around each consumer step in a profiled pass.
CONSUMER_LABEL = "pipebench/consumer"
# Host calls that block the CPU until the GPU has caught up. cudaMemcpy (no Async) waits too.
SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2",
})
# The text torch.cuda.set_sync_debug_mode("warn") warns with.
SYNC_WARNING_TEXT = "called a synchronizing CUDA operation"
NO_CUDA_NOTE = "not measured: no CUDA"


@dataclass(frozen=True)
class SyncCount:
    """Syncs over `steps` consumer steps. `ops`: op path -> count; `wait_ms`: host time blocked (None: unknown)."""

    steps: int
    syncs: int
    wait_ms: Optional[float]
    ops: Dict[str, int]

    @property
    def per_step(self) -> float:
        return self.syncs / self.steps if self.steps else float("nan")

    def ops_text(self) -> Optional[str]:
        """Each op path's syncs per step, as summary.csv's `sync_ops` shows them: 'aten::nonzero x1; ...'."""
        parts = [f"{name} x{n / self.steps:g}" for name, n in sorted(self.ops.items())]
        return "; ".join(parts) or None


def _op_path(ops: Sequence[TraceEvent]) -> str:
    outer, inner = ops[0].name, ops[-1].name
    return outer if outer == inner else f"{outer} > {inner}"


def syncs_from_trace(events: Sequence[TraceEvent], label: str = CONSUMER_LABEL) -> SyncCount:
    """Count syncs under an operator inside every `label` window (see the module docstring)."""
    steps = windows(events, label)
    ops = [e for e in events if e.cat == CPU_OP_CATEGORY]
    found: Counter = Counter()
    wait_ns = 0
    for call in events:
        if call.cat not in LAUNCH_CATEGORIES or call.name not in SYNC_CALLS:
            continue
        # Time, not thread: backward runs on autograd's device thread while the step's thread waits.
        if not any(w.contains(call) for w in steps):
            continue
        around = sorted((op for op in ops if op.tid == call.tid and op.contains(call)),
                        key=lambda op: (op.start_ns, -op.dur_ns))
        if not around:
            continue
        found[_op_path(around)] += 1
        wait_ns += call.dur_ns
    return SyncCount(len(steps), sum(found.values()), wait_ns / 1e6, dict(found))


def _call_site(record: warnings.WarningMessage) -> str:
    """`file:line: source` of the Python line that made a synchronising call."""
    source = linecache.getline(record.filename, record.lineno).strip()
    return f"{record.filename.rsplit('/', 1)[-1]}:{record.lineno}: {source}"


def count_sync_warnings(step: Callable[[], None], steps: int) -> SyncCount:
    """Run `step` `steps` times under set_sync_debug_mode("warn") (CUDA only); count and locate the
    warnings. Waiting time is not known here: `wait_ms` is None."""
    previous = torch.cuda.get_sync_debug_mode()
    # Setting the mode warns that it is a prototype: recorded here, that warning never reaches
    # the console, and it is not a sync.
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        try:
            torch.cuda.set_sync_debug_mode("warn")
            for _ in range(steps):
                step()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    found = Counter(_call_site(record) for record in records if SYNC_WARNING_TEXT in str(record.message))
    return SyncCount(steps, sum(found.values()), None, dict(found))
