"""The measured window as training sees it: whole worker cycles of steady state, and the epoch ends.

W worker processes started together deliver W batches, then the loop waits a whole cycle, so any W
consecutive steps hold one cycle's time (a thread pool's cycle is one step: its threads make each
batch together). An epoch end restarts non-persistent workers: the cycle from the epoch's first
batch holds the restart, so it is kept out of the steady rate, and its excess over a steady cycle
is the restart cost an epoch pays.
"""

from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate, islice
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from pipebench.base.stats import RatioInterval, block_ratio_interval
from pipebench.base.typed_json import parse
from pipebench.measure.steps import NS_PER_S, WINDOW_TIME_CAP, PassResult, StepSample
from pipebench.model.judging import telling

__all__ = ["EpochCost", "SteadyState", "Window", "interval_blocks", "epoch_cost", "epoch_rate",
           "rate_interval", "reused_window", "split_window", "steady_masks", "steady_state", "window_note",
           "window_record"]

CONFIDENCE_LEVEL = 0.95
# An interval block spans whole worker cycles and at least this long: a shared machine's load
# drifts on sub-second to second scales. On the 2-core machine (benchmarks/noise_check.py) blocks of
# one cycle gave half-widths 0.28-0.42x the run-to-run spread, of >= 0.5 s 0.43-0.59x, of >= 1 s
# 1.3-2.8x. Under heavier load no block size kept up: only rounds measure that part.
BLOCK_MIN_S = 1.0
# ... but never so long that fewer blocks than this remain: the blocks' spread needs several.
MIN_TIME_BLOCKS = 8

# Where an epoch's restart cost came from: epoch ends measured inside the window; the pass's own
# first batch (a restart is a fresh start of the same workers, less one batch's work); nothing to
# restart (persistent workers keep running, workers=0 has none).
RESTART_MEASURED, RESTART_FIRST_BATCH, RESTART_PERSISTENT, RESTART_NO_WORKERS = (
    "measured", "first batch", "persistent workers", "no workers")


@dataclass(frozen=True)
class Window:
    """Every pass's measured steps, cut once into worker cycles of `cycle` steps as [start, end)
    ranges into `steps`: steady cycles, and the cycle that starts at each epoch end. `crossed`: the
    epoch ends left no steady cycle, so `blocks`, the cycles the steady rate counts, are all of them."""

    passes: Tuple[PassResult, ...]
    cycle: int
    steady_cycles: Tuple[Tuple[int, int], ...]
    boundary_cycles: Tuple[Tuple[int, int], ...]

    @cached_property
    def steps(self) -> Tuple[StepSample, ...]:
        return tuple(step for result in self.passes for step in result.steps)

    @property
    def crossed(self) -> bool:
        return not self.steady_cycles and bool(self.boundary_cycles)

    @cached_property
    def blocks(self) -> Tuple[Tuple[int, int], ...]:
        if not self.crossed:
            return self.steady_cycles
        ends = list(accumulate(len(result.steps) for result in self.passes))
        return tuple(b for start, end in zip([0, *ends], ends) for b in _blocks(start, end, self.cycle))

    def steady_indices(self) -> np.ndarray:
        return np.array([i for start, end in self.blocks for i in range(start, end)], dtype=np.int64)


def _blocks(start: int, end: int, cycle: int) -> List[Tuple[int, int]]:
    return [(b, b + cycle) for b in range(start, end - cycle + 1, cycle)]


def split_window(passes: Sequence[PassResult], cycle: int) -> Window:
    """Cut each pass's steps into steady cycles and epoch-end cycles of `cycle` steps (the pass
    plan's: `steps.PassPlan.cycle`). A job cuts its window once; everything else reads the cut."""
    steps: List[StepSample] = []
    blocks: List[Tuple[int, int]] = []
    boundaries: List[Tuple[int, int]] = []
    for result in passes:
        steps.extend(result.steps)
        segment_start = len(steps) - len(result.steps)
        previous_epoch = result.start_epoch
        position = segment_start
        end = len(steps)
        while position < end:
            if steps[position].epoch != previous_epoch:
                blocks.extend(_blocks(segment_start, position, cycle))
                boundaries.append((position, min(position + cycle, end)))
                position = segment_start = min(position + cycle, end)
                # The boundary cycle may itself hold a further epoch end (epochs shorter than a
                # cycle); the next segment then starts at the epoch in force after it.
                previous_epoch = steps[position - 1].epoch
                continue
            position += 1
        blocks.extend(_blocks(segment_start, end, cycle))
    return Window(tuple(passes), cycle, tuple(blocks), tuple(boundaries))


def window_record(window: Window) -> Dict[str, Any]:
    """The window's cut alone, JSON-ready, for a merge that reuses it over other steps (the ranks'
    totals: `reused_window`)."""
    return {"cycle": window.cycle, "pass_steps": [len(result.steps) for result in window.passes],
            "steady_cycles": [list(c) for c in window.steady_cycles],
            "boundary_cycles": [list(c) for c in window.boundary_cycles]}


@dataclass(frozen=True)
class WindowCut:
    """A window's cut as `window_record` stores it: its cycle, each pass's steps, and its steady and
    epoch-end cycles as (first, end) steps over all the passes."""

    cycle: int
    pass_steps: Tuple[int, ...]
    steady_cycles: Tuple[Sequence[int], ...]
    boundary_cycles: Tuple[Sequence[int], ...]


def reused_window(record: Mapping[str, Any], passes: Sequence[PassResult]) -> Window:
    """The cut in `record` (`window_record`) over `passes` that stand for its own pass for pass (the
    ranks' totals), each as long or cut short; a cycle past a pass's end is left out and an epoch
    end's cycle cut short there."""
    steady: List[Tuple[int, int]] = []
    boundaries: List[Tuple[int, int]] = []
    own = new = 0
    cut = parse(WindowCut, record)
    for length, result in zip(cut.pass_steps, passes):
        end = own + len(result.steps)
        if end > own + length:
            raise ValueError(f"a pass of {len(result.steps)} steps over a cut of {length}")
        shift = new - own
        steady.extend((a + shift, b + shift) for a, b in cut.steady_cycles if own <= a and b <= end)
        boundaries.extend((a + shift, min(b, end) + shift) for a, b in cut.boundary_cycles if own <= a < end)
        own += length
        new += len(result.steps)
    return Window(tuple(passes), int(cut.cycle), tuple(steady), tuple(boundaries))


def interval_blocks(window: Window, step_ns: np.ndarray, min_block_ns: float, min_blocks: int
                     ) -> List[Tuple[int, ...]]:
    """The steady cycles grouped into blocks of k consecutive cycles (step indices each): k the
    fewest cycles that span `min_block_ns`, lowered until at least `min_blocks` blocks remain. No
    block spans an epoch end, and a segment's last block takes its leftover cycles, so the
    interval's estimate is the steady rate itself."""
    segments: List[List[range]] = []
    for a, b in window.blocks:
        if not segments or segments[-1][-1].stop != a:
            segments.append([])
        segments[-1].append(range(a, b))
    if not segments:
        return []
    cycle_ns = float(np.mean([step_ns[a:b].sum() for a, b in window.blocks]))
    k = max(1, int(np.ceil(min_block_ns / cycle_ns)))
    while k > 1 and sum(len(segment) // k for segment in segments) < min_blocks:
        k -= 1
    return [tuple(i for cycle in segment[start:_block_end(start, k, len(segment))] for i in cycle)
            for segment in segments for start in range(0, max(len(segment) - k, 0) + 1, k)]


def _block_end(start: int, k: int, cycles: int) -> int:
    """Where a block of k cycles from `start` ends: the segment's end for its last block."""
    return cycles if start + 2 * k > cycles else start + k


def rate_interval(window: Window, samples: np.ndarray, step_ns: np.ndarray) -> RatioInterval:
    """samples/s over the steady blocks, with the batch-means interval over blocks of whole
    cycles that each span at least BLOCK_MIN_S (machine load varies on that scale too); none where
    it is too wide to say anything (`stats.telling`, one rule for jobs, ranks and attach)."""
    blocks = interval_blocks(window, step_ns, BLOCK_MIN_S * NS_PER_S, MIN_TIME_BLOCKS)
    sample_blocks = np.array([samples[list(b)].sum() for b in blocks])
    time_blocks = np.array([step_ns[list(b)].sum() for b in blocks]) / NS_PER_S
    return telling(block_ratio_interval(sample_blocks, time_blocks, CONFIDENCE_LEVEL))


def steady_masks(window: Window) -> List[List[bool]]:
    """Per pass, which measured steps the steady rate counts (every step when none is steady),
    so result.json's raw steps give back `samples_per_s` to whoever checks it."""
    steady = set(window.steady_indices().tolist()) or set(range(len(window.steps)))
    flags = iter([i in steady for i in range(len(window.steps))])
    return [list(islice(flags, len(result.steps))) for result in window.passes]


@dataclass(frozen=True)
class EpochCost:
    """What an epoch end costs beyond steady cycles, in seconds (None: not known), and from where."""

    restart_s: Optional[float]
    source: str


def epoch_cost(window: Window, workers: int, persistent: bool) -> EpochCost:
    """The restart cost of an epoch: a boundary cycle's time minus a steady cycle's, the median over
    the window's epoch ends; else from the passes' first batch, the same fresh start of the workers
    plus one cycle's work. `persistent`: the workers outlive the epoch (never a thread pool's)."""
    if workers == 0:
        return EpochCost(0.0, RESTART_NO_WORKERS)
    steady = window.steady_indices()
    if steady.size == 0:
        return EpochCost(None, RESTART_MEASURED)
    step_ns = np.array([s.step_ns for s in window.steps], dtype=np.float64)
    steady_step_ns = float(step_ns[steady].mean())
    whole = [(a, b) for a, b in window.boundary_cycles if b - a == window.cycle]
    if whole and not window.crossed:
        excess = [float(step_ns[a:b].sum()) - window.cycle * steady_step_ns for a, b in whole]
        return EpochCost(max(float(np.median(excess)), 0.0) / NS_PER_S, RESTART_MEASURED)
    if persistent:
        return EpochCost(0.0, RESTART_PERSISTENT)
    first = float(np.median([p.first_batch_s for p in window.passes]))
    return EpochCost(max(first - window.cycle * steady_step_ns / NS_PER_S, 0.0), RESTART_FIRST_BATCH)


def epoch_rate(steady_rate: float, samples_per_epoch: Optional[int], cost: EpochCost) -> Optional[float]:
    """Samples an epoch / (its steady time + the restart cost): what an epoch really delivers."""
    if samples_per_epoch is None or cost.restart_s is None or not steady_rate > 0:
        return None
    return samples_per_epoch / (samples_per_epoch / steady_rate + cost.restart_s)


def window_note(window: Window, batches_per_epoch: Optional[int], target_steps: int) -> Optional[str]:
    """One line when the window is not the plain steady state it should be; None when it is."""
    notes = []
    if window.boundary_cycles:
        epoch = f"an epoch is {batches_per_epoch} batches; " if batches_per_epoch else ""
        if window.crossed:
            notes.append(f"{epoch}every cycle of the window crossed an epoch end, so samples/s includes "
                         f"{len(window.boundary_cycles)} restart(s); use a longer dataset")
        else:
            left_out = sum(b - a for a, b in window.boundary_cycles)
            notes.append(f"{epoch}the window crossed {len(window.boundary_cycles)} epoch end(s): samples/s is the "
                         f"steady state between them ({left_out} restart steps left out; samples_per_s_epoch "
                         "counts them)")
    capped = [p for p in window.passes if p.stop_reason == WINDOW_TIME_CAP]
    if capped:
        steps = min(len(p.steps) for p in capped)
        notes.append(f"window capped by run.max_time_s at {steps} steps (wanted {target_steps})")
    return "; ".join(notes) or None


@dataclass(frozen=True)
class SteadyState:
    """What the window gives a job's summary: its steady steps (every step where no whole cycle
    is steady) and their times, the steady and epoch rates, the interval, the restart cost, the note."""

    window: Window
    steps: Tuple[StepSample, ...]
    step_ns: np.ndarray
    rate: float
    interval: RatioInterval
    cost: EpochCost
    epoch_rate: Optional[float]
    note: Optional[str]


def steady_state(window: Window, step_field: str, workers: int, persistent: bool, samples_per_epoch: Optional[int],
                 batches_per_epoch: Optional[int], target_steps: int) -> SteadyState:
    """The steady state of every repeat's window, each step timed by `step_field` (its host time,
    or at run.sync=async its span on the GPU's clock, so samples/s is what the GPU got through)."""
    all_step_ns = np.array([getattr(s, step_field) for s in window.steps], dtype=np.float64)
    all_samples = np.array([s.samples for s in window.steps], dtype=np.float64)
    interval = rate_interval(window, all_samples, all_step_ns)
    steady = window.steady_indices()
    if steady.size == 0:  # fewer steps than one cycle: every step, no interval
        steady = np.arange(len(window.steps))
    rate = float(all_samples[steady].sum() * NS_PER_S / all_step_ns[steady].sum())
    cost = epoch_cost(window, workers, persistent)
    return SteadyState(window, tuple(window.steps[i] for i in steady), all_step_ns[steady], rate, interval, cost,
                       epoch_rate(rate, samples_per_epoch, cost), window_note(window, batches_per_epoch, target_steps))
