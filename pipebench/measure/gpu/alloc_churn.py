"""CUDA caching-allocator churn: reserved memory per measured step, cudaFree/retry counts, oscillation.

Varying tensor shapes defeat the caching allocator: it frees its cached blocks (cudaFree, a
device-wide sync) and maps new ones, so reserved memory goes up and down. memory_reserved() is a
cheap read after every step; memory_stats() builds ~100 entries, so it is read at the marks only.
"""

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from pipebench.base.typed_json import parse
from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED, Meter

BYTES_PER_MB = 1 << 20
# A step-to-step change of reserved memory smaller than this share of the peak is jitter, not a
# swing: the allocator rounds segments to 2 MiB (20 MiB for large ones), so a 5% floor keeps
# rounding noise from reading as oscillation while a freed-and-remapped batch buffer still counts.
OSCILLATION_MIN_SWING_FRACTION = 0.05
# Direction reversals (up then down, or down then up) of significant swings that make a series
# "oscillating": one reversal is a spike, two a spike and recovery; three or more is a cycle.
OSCILLATION_MIN_REVERSALS = 3


def reversals(series: Sequence[float], min_swing_fraction: float = OSCILLATION_MIN_SWING_FRACTION) -> int:
    """Sign changes between consecutive significant step-to-step changes of `series`: those of at
    least min_swing_fraction x max(series); smaller ones are dropped before the signs are compared."""
    if len(series) < 3:
        return 0
    floor = min_swing_fraction * max(abs(v) for v in series)
    signs = [1 if b > a else -1 for a, b in zip(series, series[1:]) if abs(b - a) >= floor and b != a]
    return sum(1 for s, t in zip(signs, signs[1:]) if s != t)


def is_oscillating(series: Sequence[float], min_reversals: int = OSCILLATION_MIN_REVERSALS,
                   min_swing_fraction: float = OSCILLATION_MIN_SWING_FRACTION) -> bool:
    """The oscillation rule: at least `min_reversals` reversals of significant swings."""
    return reversals(series, min_swing_fraction) >= min_reversals


@dataclass(frozen=True)
class AllocatorReport:
    """Reserved memory over the measured steps and the allocator counters' growth (None: not measured)."""

    reserved_mb: List[float]
    reserved_mb_peak: Optional[float]
    reversals: Optional[int]
    oscillating: Optional[bool]
    alloc_retries: Optional[int]
    device_allocs: Optional[int]
    device_frees: Optional[int]
    note: Optional[str]


@dataclass(frozen=True)
class AllocatorCounts:
    """The memory_stats() counters read at a mark; their growth over the measured steps is reported."""

    num_alloc_retries: int = 0
    num_device_alloc: int = 0
    num_device_free: int = 0


class AllocatorTracker(Meter):
    """A Meter of allocator state over the measured steps of a consumer running on `device`: the
    marks read the counters, `sample()` (the step loop's `after_measured`) reserved memory; both do
    nothing unless `device` is a CUDA device."""

    key = "allocator"

    def __init__(self, device: Optional[torch.device]):
        self.active = device is not None and device.type == "cuda"
        self.device = device
        self._reserved: List[int] = []
        self._stats: Dict[str, AllocatorCounts] = {}

    def mark(self, name: str) -> None:
        if self.active:
            self._stats[name] = parse(AllocatorCounts, torch.cuda.memory_stats(self.device))

    def sample(self) -> None:
        if self.active:
            self._reserved.append(torch.cuda.memory_reserved(self.device))

    def columns(self) -> Dict[str, Any]:
        report = self.report()
        return {"reserved_mb_peak": report.reserved_mb_peak, "alloc_retries": report.alloc_retries,
                "device_frees": report.device_frees, "reserved_oscillating": report.oscillating}

    def record(self) -> Dict[str, Any]:
        return asdict(self.report())

    def report(self) -> AllocatorReport:
        if not self.active:
            return AllocatorReport([], None, None, None, None, None, None, "not measured: no CUDA consumer")
        mb = [r / BYTES_PER_MB for r in self._reserved]
        a, b = self._stats.get(FIRST_MEASURED), self._stats.get(LAST_MEASURED)
        both = a is not None and b is not None
        return AllocatorReport(
            reserved_mb=mb,
            reserved_mb_peak=max(mb) if mb else None,
            reversals=reversals(mb),
            oscillating=is_oscillating(mb),
            alloc_retries=b.num_alloc_retries - a.num_alloc_retries if both else None,
            device_allocs=b.num_device_alloc - a.num_device_alloc if both else None,
            device_frees=b.num_device_free - a.num_device_free if both else None,
            note=None,
        )
