"""tune's search space, and the points the cost model drops before anything races, each with its reason.

A point is one loader setting for one chain. `grid` is every combination of the values `tune.*`
allows; `prune` drops, with the first reason that applies (docs/tune.md says each in full): a setting
that changes nothing, threads the GIL would hold back (Amdahl's bound on the chain's GIL-holding
share), and workers past the model's knee (one count past it still races, so the measurement checks
the model). `fit_budget` then keeps what one round of the race can measure in the budget, and
`model_ladder` sets the worker counts where the user gave none.
"""

import dataclasses
import itertools
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.config.specs import BACKEND_WORKER_KINDS, THREADS
from pipebench.measure.thread_verdict import HOLDS_GIL as THREAD_HOLDS_GIL
from pipebench.model.costs import ChainCosts, predict
from pipebench.record.jobs import JobResult
from pipebench.report.job_sections import sections_of

__all__ = ["CHANGES_NOTHING", "HOLDS_GIL", "LADDER_CAP", "MIN_RACED_POINTS", "PAST_THE_BUDGET", "PAST_THE_KNEE",
           "SETTING_KEYS", "ChainModel", "Dimensions", "Dropped", "LadderTop", "Point", "fit_budget",
           "gil_share", "grid", "knee_workers", "ladder_top", "model_ladder", "one_point_note", "predicted_rate",
           "prune", "thread_speedup_bound"]

# The setting every workers=0 point carries: the in-process loop reads none of the worker settings,
# so all workers=0 points of a chain are this one. The schema's defaults (pipebench.config.schema).
SERIAL_BACKEND = "dataloader"
SERIAL_PREFETCH = 2
# The config key each of a point's fields sets, in the fields' order.
SETTING_KEYS = ("transform", "workers", "loader.backend", "loader.prefetch_factor", "loader.persistent_workers",
                "loader.pin_memory", "loader.batch_size")
# How a point's name joins its fields: a Hydra config name, so no `,` `=` or `@`.
NAME_SEPARATOR = "-"
# The model's predicted rate at the knee is reached within this share by fewer workers; the knee is
# the fewest workers within it of the most the model predicts (EXPLAINED_WITHIN: what it cannot tell
# apart from the measurement anyway).
KNEE_WITHIN = 0.15
# The fewest points the race measures, whatever the budget's cut: a race of one or two points has
# nothing to check the model's ranking against (the seed chain at --budget-s 240 raced one point of
# 96, and the cut and the kept point were predicted alike).
MIN_RACED_POINTS = 3
# The most workers the ladder offers where the user names none, whatever the model says: each worker
# is a process holding its own interpreter, file descriptors and pipes, and the main process unpickles
# every batch alone; a chain that needs more than 64 waiting readers wants an asynchronous reader
# (SPDL, an object store's async client), not more processes.
LADDER_CAP = 64
# The share of the host's available memory the workers may take between them: the rest is the
# main process's, the page cache's (the data set) and other tenants'.
MEMORY_SHARE = 0.5
# How far past the model's knee the ladder reaches: one rung past it races, so the measurement can
# find a knee later than the model's (the sleeping chain: model 10 workers, measured 12+).
KNEE_HEADROOM = 1.5
# The ladder's rungs: powers of two, with the half octaves from 6 up (3 would add a rung next to 2
# and 4, where a 2-core host's knee is the cores anyway).
HALF_OCTAVE_FROM = 6
# A rung this close below the top is left out: the top alone stands for it (24 and 25 workers would
# race two points whose rates the intervals cannot tell apart).
RUNG_GAP = 1.125


@dataclass(frozen=True)
class Point:
    """One setting of the loader for one chain (a `transform` config name)."""

    chain: str
    workers: int
    backend: str
    prefetch_factor: int
    persistent_workers: bool
    pin_memory: bool
    batch_size: int

    @property
    def name(self) -> str:
        """A config name that says the point: `yuv_mask-w4-dataloader-pf2-persistent-b32`."""
        parts = [self.chain, f"w{self.workers}", self.backend, f"pf{self.prefetch_factor}"]
        parts += ["persistent"] * self.persistent_workers + ["pinned"] * self.pin_memory + [f"b{self.batch_size}"]
        return NAME_SEPARATOR.join(parts)

    @property
    def worker_kind(self) -> str:
        return BACKEND_WORKER_KINDS[self.backend]

    def settings(self) -> Dict[str, object]:
        """The point as config keys and values (`loader.backend`: `threads`), the chain first."""
        return dict(zip(SETTING_KEYS, dataclasses.astuple(self)))

    @classmethod
    def probe(cls, chain: str, batch_size: int) -> "Point":
        """The chain's workers=0 point, as the cost model's probe runs it."""
        return cls(chain, 0, SERIAL_BACKEND, SERIAL_PREFETCH, False, False, batch_size)

    def as_run(self, cuda: bool) -> "Point":
        """The point a job with these settings measures: what changes nothing here set as it runs
        (no pinning without CUDA, the in-process loop at workers=0, no persistence for threads)."""
        point = dataclasses.replace(self, pin_memory=self.pin_memory and cuda)
        if point.workers == 0:
            return point.serial()
        return dataclasses.replace(point, persistent_workers=False) if point.worker_kind == THREADS else point

    def serial(self) -> "Point":
        """The workers=0 point this one runs as when it has no workers."""
        return dataclasses.replace(self, backend=SERIAL_BACKEND, prefetch_factor=SERIAL_PREFETCH,
                                   persistent_workers=False)


@dataclass(frozen=True)
class Dimensions:
    """The values each of a Point's fields may take, in its order (`tune.*`, or what the host and dataset allow)."""

    chains: Tuple[str, ...]
    workers: Tuple[int, ...]
    backends: Tuple[str, ...]
    prefetch_factors: Tuple[int, ...]
    persistent_workers: Tuple[bool, ...]
    pin_memory: Tuple[bool, ...]
    batch_sizes: Tuple[int, ...]


@dataclass(frozen=True)
class ChainModel:
    """What the model knows of one chain from its workers=0 probe: its costs, the steps that hold the
    GIL, their share of the chain's time (0..1, from the thread profile), and each worker's memory
    (MiB: the probe's PSS, the most a worker process that copies it can hold; nan where unmeasured)."""

    costs: ChainCosts
    gil_steps: Tuple[str, ...] = ()
    gil_share: float = 0.0
    worker_mb: float = float("nan")

    def at_batch(self, batch_size: int) -> ChainCosts:
        """The chain's costs at another batch size: per-sample costs and the consumer's step stay."""
        return dataclasses.replace(self.costs, batch_size=batch_size)


def gil_share(results: Sequence[JobResult]) -> float:
    """The share (0..1) of a chain's time in steps whose thread profile says they hold the GIL: the
    median over the jobs that ran the profile of their `holds_gil` rows' `share_pct`; 0 with none."""
    shares = [sum(row.share_pct for row in result.transform_rows if row.thread_verdict == THREAD_HOLDS_GIL) / 100.0
              for result in results if sections_of(result).thread_profile]
    return statistics.median(shares) if shares else 0.0


@dataclass(frozen=True)
class LadderTop:
    """The most workers the ladder offers, and which bound set it (the model's knee, memory or the cap)."""

    workers: int
    why: str


def ladder_top(costs: ChainCosts, worker_mb: float, available_mb: float) -> LadderTop:
    """Where the worker ladder stops for one chain. The model's knee for a chain that waits is near
    (wall / CPU a sample) x cores: that many workers keep the cores busy while the rest wait; the
    ladder reaches KNEE_HEADROOM past it (never below twice the cores), bounded by MEMORY_SHARE of
    the available memory at `worker_mb` a worker and by LADDER_CAP."""
    cores = max(1, costs.usable_cores)
    waits = costs.ms_per_sample / costs.cpu_ms_per_sample if costs.cpu_ms_per_sample > 0 else math.inf
    knee = max(1.0, waits) * cores
    past = math.ceil(KNEE_HEADROOM * knee) if math.isfinite(knee) else LADDER_CAP
    knee_words = (f"the model's knee: {costs.ms_per_sample:.3g} ms of wall against {costs.cpu_ms_per_sample:.3g} ms "
                  f"of CPU a sample x {cores} cores = {knee:.3g} workers")
    by_model = (past, f"{knee_words}, and {KNEE_HEADROOM:g}x past it") if past > 2 * cores else \
        (2 * cores, f"twice the {cores} cores, as {knee_words}, lies within them")
    bounds = [(min(by_model[0], LADDER_CAP), by_model[1]),
              (LADDER_CAP, f"the cap of {LADDER_CAP} workers (a chain that needs more wants an async reader)")]
    if math.isfinite(worker_mb) and worker_mb > 0:
        bounds.append((max(1, math.floor(MEMORY_SHARE * available_mb / worker_mb)),
                       f"memory: {worker_mb:.0f} MiB a worker (the probe's PSS) in {MEMORY_SHARE:.0%} of "
                       f"{available_mb:.0f} MiB available"))
    workers, why = min(bounds, key=lambda bound: bound[0])
    return LadderTop(workers, why)


def model_ladder(top: int, cores: int) -> Tuple[int, ...]:
    """0, the powers of two and (from HALF_OCTAVE_FROM) the half octaves up to `top`, the cores, twice
    the cores and `top` itself (less a rung within RUNG_GAP below it): a rung at each step where the
    rate can still change by a third or more."""
    rungs = {0, top, *(c for c in (max(1, cores), 2 * max(1, cores)) if c <= top)}
    power = 1
    while power <= top:
        rungs.add(power)
        if power * 3 // 2 >= HALF_OCTAVE_FROM and power * 3 // 2 <= top:
            rungs.add(power * 3 // 2)
        power *= 2
    return tuple(sorted(r for r in rungs if r == top or r * RUNG_GAP < top))


# The pruning rules, in the order they apply (module doc), as tune.md groups the dropped points.
CHANGES_NOTHING = "a setting that changes nothing"
HOLDS_GIL = "threads the GIL holds back (Amdahl's bound)"
PAST_THE_KNEE = "workers past the cores' knee"
PAST_THE_BUDGET = "ranked below the points one round of the budget fits"


@dataclass(frozen=True)
class Dropped:
    point: Point
    reason: str
    rule: str


def grid(dims: Dimensions) -> List[Point]:
    """Every combination of the dimensions (whose fields are Point's, in order), in a stable order."""
    return [Point(*values) for values in itertools.product(*dataclasses.astuple(dims))]


def _changes_nothing(point: Point, cuda: bool) -> str:
    if point.pin_memory and not cuda:
        return "pin_memory: no CUDA device here, so pinning does nothing"
    if point.workers == 0 and point != point.serial():
        return ("workers=0: one in-process loop under every backend, so the backend, prefetch_factor and "
                "persistent_workers change nothing (raced as " + point.serial().name + ")")
    if point.workers > 0 and point.worker_kind == THREADS and point.persistent_workers:
        return (f"persistent_workers: loader.backend={point.backend} runs threads, and the setting is for worker "
                "processes")
    return ""


def thread_speedup_bound(share: float, workers: int) -> float:
    """Amdahl's bound on `workers` threads' speed-up over one for a chain that holds the GIL a `share`
    of its time: the GIL-holding part runs one thread at a time, so the speed-up never passes 1/share
    (Amdahl's limit; the rest of the chain overlaps it, so the limit rather than the formula's curve
    at `workers`), nor `workers`."""
    return min(float(workers), 1.0 / share) if share > 0 else float(workers)


def _holds_gil(point: Point, model: Optional[ChainModel]) -> str:
    if point.workers == 0 or point.worker_kind != THREADS or model is None or model.gil_share <= 0:
        return ""
    costs = model.at_batch(point.batch_size)
    processes = predict(costs, point.workers).samples_per_s
    bound = thread_speedup_bound(model.gil_share, point.workers)
    threads = min(processes, bound * predict(costs, 1).samples_per_s)
    if threads >= (1 - KNEE_WITHIN) * processes:
        return ""
    steps = f" ({', '.join(model.gil_steps)})" if model.gil_steps else ""
    return (f"loader.backend={point.backend}: {model.gil_share:.0%} of {point.chain}'s time holds the GIL{steps}, "
            f"so by Amdahl's bound {point.workers} threads reach at most {bound:.2g}x one ({threads:.0f} samples/s), "
            f"short of the {processes:.0f} worker processes would give")


def predicted_rate(point: Point, model: Optional[ChainModel]) -> float:
    """The model's samples/s at this point (nan without a model)."""
    if model is None:
        return float("nan")
    return predict(model.at_batch(point.batch_size), point.workers).samples_per_s


def knee_workers(costs: ChainCosts, ladder: Sequence[int]) -> int:
    """The fewest workers of `ladder` whose predicted rate is within KNEE_WITHIN of the most any
    count of the ladder reaches: past it, the cores (or the consumer) cap the rate."""
    rates = {w: predict(costs, w).samples_per_s for w in ladder}
    top = max(rates.values())
    return min(w for w, rate in rates.items() if rate >= (1 - KNEE_WITHIN) * top)


def _past_the_knee(point: Point, model: Optional[ChainModel], ladder: Sequence[int]) -> str:
    if model is None or point.workers == 0:
        return ""
    costs = model.at_batch(point.batch_size)
    knee = knee_workers(costs, ladder)
    raced = [w for w in sorted(ladder) if w > knee][:1]  # one count past the knee checks the model
    if point.workers <= max([knee, *raced]):
        return ""
    at_knee, cap = predict(costs, knee), predict(costs, max(ladder))
    return (f"workers={point.workers}: the model has {point.chain} at {at_knee.samples_per_s:.0f} samples/s "
            f"({cap.bound}-bound) from {knee} workers ({costs.usable_cores} usable cores at "
            f"{costs.cpu_ms_per_sample:.3g} ms of CPU a sample); more workers only time-slice, and "
            f"workers={max([knee, *raced])} checks it")


def prune(points: Sequence[Point], models: Mapping[str, ChainModel], cuda: bool
          ) -> Tuple[List[Point], List[Dropped]]:
    """The points worth racing, and each other one with the first reason (module doc) that drops it."""
    kept: List[Point] = []
    dropped: List[Dropped] = []
    ladder = sorted({p.workers for p in points})
    for point in points:
        model = models.get(point.chain)
        found = ((CHANGES_NOTHING, _changes_nothing(point, cuda)), (HOLDS_GIL, _holds_gil(point, model)),
                 (PAST_THE_KNEE, _past_the_knee(point, model, ladder)))
        rule, reason = next(((r, why) for r, why in found if why), ("", ""))
        if reason:
            dropped.append(Dropped(point, reason, rule))
        elif point not in kept:
            kept.append(point)
    return kept, dropped


def fit_budget(points: Sequence[Point], models: Mapping[str, ChainModel], seconds: float,
               round_s: Callable[[Point], float]) -> Tuple[List[Point], List[Dropped]]:
    """The points the model ranks best (predicted samples/s, then fewer workers) whose round of the
    race, `round_s(point)` seconds each (`pipebench.tune.job_cost`), fits in `seconds` together, never
    fewer than MIN_RACED_POINTS; and the rest, each with the reason. All of them where they fit."""

    def rank(point: Point) -> Tuple[float, int]:
        rate = predicted_rate(point, models.get(point.chain))
        return (-rate if not math.isnan(rate) else 0.0, point.workers)

    ranked = sorted(points, key=rank)
    spent = list(itertools.accumulate(round_s(p) for p in ranked))
    room = max(MIN_RACED_POINTS, sum(s <= seconds for s in spent))
    if len(points) <= room:
        return list(points), []
    kept, cut = ranked[:room], ranked[room:]
    return [p for p in points if p in kept], [Dropped(p, _cut_reason(p, kept[-1], room, models), PAST_THE_BUDGET)
                                              for p in cut]


def _cut_reason(point: Point, last: Point, room: int, models: Mapping[str, ChainModel]) -> str:
    """Why the budget's cut left `point` out, against `last`, the last point kept."""
    rate, floor = (predicted_rate(p, models.get(p.chain)) for p in (point, last))
    if not math.isnan(rate) and not math.isnan(floor) and round(rate) >= round(floor):
        ranked = (f"the model predicts it level with the last kept, {last.name} ({rate:.0f} samples/s each), "
                  "and keeps the fewer workers first")
    else:
        ranked = f"the model predicts {rate:.0f} samples/s, below the last kept, {last.name} ({floor:.0f})"
    return f"one round of the budget fits {room} points, the model's best, at their workers' cost: {ranked}"


def one_point_note(kept: Sequence[Point]) -> str:
    """The line saying the space left one point to race ('' otherwise): a race of one has nothing to
    compare, but the point is measured all the same, for its figures and the verification."""
    if len(kept) != 1:
        return ""
    return (f"the space has one point after pruning and the budget's cut: {kept[0].name}; there is nothing to race "
            "it against, and it is measured all the same")
