"""What a step's thread-scaling profile says: it scales, it holds the GIL, it waits, or it is CPU-bound.

Pure arithmetic (no torch), so the report stage reads the verdict names without the measuring side.
The thread counts never exceed the usable cores, so a thread off the CPU is not waiting for a core:
it waits on I/O or a sleep (already alone), or on a lock its calls share, the GIL first of all.
"""

from dataclasses import dataclass
from typing import Tuple

__all__ = ["CPU_BOUND", "HOLDS_GIL", "SCALES", "VERDICTS", "WAITS", "ScalingFigures", "thread_verdict"]

SCALES = "scales"
HOLDS_GIL = "holds_gil"
WAITS = "waits"
CPU_BOUND = "cpu_bound"
VERDICTS = (SCALES, HOLDS_GIL, WAITS, CPU_BOUND)
# A step that makes at least this share of k threads' ideal k-fold rate scales: steps that release
# the GIL reached 0.95-1.0 at 2 threads on the 2-core machine (Sleep, the JPEG decode,
# RandomResizedCrop), a pure-Python one 0.5 (BusyWait); 0.75 splits them with room for noise.
SCALES_EFFICIENCY = 0.75
# Off the CPU for at least half of its wall time alone: the step mostly waits (I/O, a sleep, a
# device), so its speed-up on threads is about its waits, not the GIL.
WAITS_OFF_CPU = 0.5
# When at least this share of what a step lost to threads was off the CPU (`loss_off_cpu`), its
# threads queued for a lock they share, the GIL for Python code. At 2 threads on the 2-core machine
# steps with Python around their work lost 0.4-1.0 off the CPU (BusyWait, PILToTensor, ToTensor,
# Normalize), a collate slowed by memory 0.03, a decode slowed by another tenant 0.2.
GIL_LOSS_OFF_CPU = 0.3


@dataclass(frozen=True)
class ScalingFigures:
    """One step's profile: thread counts (1 first), the speed-up at each, and its off-CPU share
    (0..1) alone and at the highest count."""

    threads: Tuple[int, ...]
    speedups: Tuple[float, ...]
    off_cpu_alone: float
    off_cpu_top: float

    @property
    def top_threads(self) -> int:
        return self.threads[-1]

    @property
    def top_speedup(self) -> float:
        return self.speedups[-1]

    @property
    def efficiency(self) -> float:
        """The speed-up at the highest count over that count (1.0: perfect scaling)."""
        return self.top_speedup / self.top_threads

    @property
    def loss_off_cpu(self) -> float:
        """The share of the wall time a call lost to threads that it spent off the CPU.

        At k threads and speed-up s a call takes k/s times its wall time alone. Had its CPU time
        stayed the same, all of that extra time is off the CPU and its off-CPU share reaches
        1 - (s/k)(1 - alone); had the extra time all been on the CPU (cores or memory shared), the
        share stays as it was alone. Where it lands between the two is this ratio (0..1, past 1 by noise).
        """
        lost = (1.0 - self.off_cpu_alone) * (1.0 - self.efficiency)
        return (self.off_cpu_top - self.off_cpu_alone) / lost if lost > 0 else 0.0


def thread_verdict(figures: ScalingFigures) -> str:
    """SCALES, HOLDS_GIL, WAITS or CPU_BOUND; '' when only one thread was profiled. WAITS comes
    first, so a sleep or a read is never called GIL-bound; CPU_BOUND is what is left: a step that
    kept the CPU and still did not scale (other tenants, SMT siblings, memory bandwidth)."""
    if figures.top_threads < 2:
        return ""
    if figures.off_cpu_alone >= WAITS_OFF_CPU:
        return WAITS
    if figures.efficiency >= SCALES_EFFICIENCY:
        return SCALES
    if figures.loss_off_cpu >= GIL_LOSS_OFF_CPU:
        return HOLDS_GIL
    return CPU_BOUND
