"""tune's search space, and the points the cost model drops before anything races, each with its reason.

A point is one loader setting for one chain: workers, `loader.backend`, `prefetch_factor`,
`persistent_workers`, `pin_memory` and the batch size. `grid` is every combination of the values
`tune.*` allows; `prune` drops, in this order, with the first reason that applies:

- a setting that changes nothing: `pin_memory` without CUDA; at workers=0 the backend, prefetch and
  persistence (one in-process loop under every backend); `persistent_workers` under a thread backend;
- threads for a chain whose steps hold the GIL (its workers-=0 thread profile,
  `pipebench.report.thread_advice.gil_bound_steps`): its threads would queue for the GIL;
- workers past what the cores allow: the diagnosis's napkin model (`pipebench.report.diagnosis.predict`)
  says where added workers stop adding samples/s (the cores' budget, or the consumer's appetite);
  the worker counts up to that knee and one count past it race, so the measurement checks the model,
  and the rest never run.

`fit_budget` then keeps what one round of the race can measure in the budget, best predicted first.
"""

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from pipebench.config.specs import BACKEND_WORKER_KINDS, THREADS
from pipebench.report.diagnosis import ChainCosts, predict

__all__ = ["CHANGES_NOTHING", "HOLDS_GIL", "PAST_THE_BUDGET", "PAST_THE_KNEE", "ChainModel", "Dimensions", "Dropped",
           "Point", "fit_budget", "grid", "knee_workers", "one_point_note", "predicted_rate", "prune"]

# The setting every workers=0 point carries: the in-process loop reads none of the worker settings,
# so all workers=0 points of a chain are this one. The schema's defaults (pipebench.config.schema).
SERIAL_BACKEND = "dataloader"
SERIAL_PREFETCH = 2
# How a point's name joins its fields: a Hydra config name, so no `,` `=` or `@`.
NAME_SEPARATOR = "-"
# The model's predicted rate at the knee is reached within this share by fewer workers; the knee is
# the fewest workers within it of the most the model predicts (EXPLAINED_WITHIN: what it cannot tell
# apart from the measurement anyway).
KNEE_WITHIN = 0.15


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
        return {"transform": self.chain, "workers": self.workers, "loader.backend": self.backend,
                "loader.prefetch_factor": self.prefetch_factor,
                "loader.persistent_workers": self.persistent_workers, "loader.pin_memory": self.pin_memory,
                "loader.batch_size": self.batch_size}

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
    """The values each setting may take (`tune.*`, or what the host and the dataset allow)."""

    chains: Tuple[str, ...]
    workers: Tuple[int, ...]
    backends: Tuple[str, ...]
    prefetch_factors: Tuple[int, ...]
    persistent_workers: Tuple[bool, ...]
    pin_memory: Tuple[bool, ...]
    batch_sizes: Tuple[int, ...]


@dataclass(frozen=True)
class ChainModel:
    """What the model knows of one chain from its workers=0 probe: its costs, and the steps that hold the GIL."""

    costs: ChainCosts
    gil_steps: Tuple[str, ...] = ()


# The pruning rules, in the order they apply (module doc), as tune.md groups the dropped points.
CHANGES_NOTHING = "a setting that changes nothing"
HOLDS_GIL = "threads for a chain that holds the GIL"
PAST_THE_KNEE = "workers past the cores' knee"
PAST_THE_BUDGET = "more than one round of the budget fits"


@dataclass(frozen=True)
class Dropped:
    point: Point
    reason: str
    rule: str


def grid(dims: Dimensions) -> List[Point]:
    """Every combination of the dimensions, in a stable order (chain, workers, backend, ...)."""
    return [Point(*values) for values in itertools.product(
        dims.chains, dims.workers, dims.backends, dims.prefetch_factors, dims.persistent_workers, dims.pin_memory,
        dims.batch_sizes)]


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


def _holds_gil(point: Point, model: Optional[ChainModel]) -> str:
    if point.workers == 0 or point.worker_kind != THREADS or model is None or not model.gil_steps:
        return ""
    return (f"loader.backend={point.backend}: {point.chain}'s steps {', '.join(model.gil_steps)} hold the GIL "
            "(its thread profile), so its threads would queue for it")


def _with_batch(costs: ChainCosts, batch_size: int) -> ChainCosts:
    """The chain's costs at another batch size: per-sample costs stay, the consumer's step stays."""
    return dataclasses.replace(costs, batch_size=batch_size)


def predicted_rate(point: Point, model: Optional[ChainModel]) -> float:
    """The model's samples/s at this point (nan without a model)."""
    if model is None:
        return float("nan")
    return predict(_with_batch(model.costs, point.batch_size), point.workers).samples_per_s


def knee_workers(costs: ChainCosts, ladder: Sequence[int]) -> int:
    """The fewest workers of `ladder` whose predicted rate is within KNEE_WITHIN of the most any
    count of the ladder reaches: past it, the cores (or the consumer) cap the rate."""
    rates = {w: predict(costs, w).samples_per_s for w in ladder}
    top = max(rates.values())
    return min(w for w, rate in rates.items() if rate >= (1 - KNEE_WITHIN) * top)


def _past_the_knee(point: Point, model: Optional[ChainModel], ladder: Sequence[int]) -> str:
    if model is None or point.workers == 0:
        return ""
    costs = _with_batch(model.costs, point.batch_size)
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


def fit_budget(points: Sequence[Point], models: Mapping[str, ChainModel], room: int
               ) -> Tuple[List[Point], List[Dropped]]:
    """The `room` points the model ranks best (predicted samples/s, then fewer workers), and the rest,
    each with the reason; all of them where they fit."""
    if len(points) <= room:
        return list(points), []

    def rank(point: Point) -> Tuple[float, int]:
        rate = predicted_rate(point, models.get(point.chain))
        return (-rate if not math.isnan(rate) else 0.0, point.workers)

    ranked = sorted(points, key=rank)
    kept, cut = ranked[:room], ranked[room:]
    floor = predicted_rate(kept[-1], models.get(kept[-1].chain))
    return ([p for p in points if p in kept],
            [Dropped(p, f"the budget fits one round of {room} points, and the model ranks this one below them "
                        f"(predicted {predicted_rate(p, models.get(p.chain)):.0f} samples/s, the last kept "
                        f"{floor:.0f})", PAST_THE_BUDGET) for p in cut])


def one_point_note(kept: Sequence[Point]) -> str:
    """The line saying the space left one point to race ('' otherwise): a race of one has nothing to
    compare, but the point is measured all the same, for its figures and the verification."""
    if len(kept) != 1:
        return ""
    return (f"the space has one point after pruning and the budget's cut: {kept[0].name}; there is nothing to race "
            "it against, and it is measured all the same")
