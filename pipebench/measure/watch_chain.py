"""Per-transform time inside the workers of a watched loader, with the user's results unchanged.

`timed_recipe` opens the dataset's transform recipe (`dataset.transform`, else `.transforms`: a
torchvision v1/v2 `Compose`, or any Compose-like with a `transforms` list, or a list of callables)
and puts a shallow copy in its place whose steps are `TimedStep`s: each calls the user's step as it
was and records its wall time (and the sample's thread-CPU time) into the recipe's `StepClock`. A lazily opened PIL
image reaching the first step is decoded first, timed as its own `decode` row (the timed chain's
rule, `timed_chain.undecoded`). A recipe that cannot be opened is timed whole, as one row whose name
says why.

The timings travel as `timed_chain`'s do, with the batch: `RidingCollate` replaces
`loader.collate_fn`, calls the user's collate (timed as the `collate` row) and returns a `Riding`
(batch, timings); the watch strips it in the main process, so the user gets the batch their
collate made. The clock, the steps and the collate are plain picklable objects: under fork and
spawn alike each worker gets its own copy of the clock with its copy of the dataset (one pickle
holds both, so they stay one object).
"""

import contextlib
import copy
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from torch.utils.data import DataLoader
from torch.utils.data._utils.pin_memory import pin_memory

from pipebench.pipeline.stages import COLLATE_STAGE, DECODE_STAGE, PER_SAMPLE_STAGE
from pipebench.pipeline.timed_chain import DECODE_NAME, DECODES_ITSELF_ATTR, StepName, step_names, undecoded

__all__ = ["Recipe", "Riding", "RidingCollate", "StepClock", "TimedStep", "open_recipe", "timed_recipe"]

# The attributes a dataset's recipe is looked for under, in this order: torchvision's
# VisionDataset sets both, `transforms` to a StandardTransform of `transform`, which it calls.
RECIPE_ATTRS = ("transform", "transforms")
# Column 0 of a sample's timings is the forced decode; the recipe's steps follow.
DECODE_COLUMN = 0


@dataclass(frozen=True)
class Recipe:
    """What `open_recipe` found: the attribute, its steps (one, the whole recipe, when it could not
    be opened) and why it could not be, or None when it was opened."""

    attr: str
    steps: Tuple[Callable, ...]
    not_opened: Optional[str] = None

    @property
    def names(self) -> List[StepName]:
        """The rows: the decode, then one a step (the whole recipe named with the reason when it was not opened)."""
        if self.not_opened is not None:
            rows = [StepName(PER_SAMPLE_STAGE, f"{type(self.steps[0]).__name__} (not opened: {self.not_opened})")]
        else:
            rows = step_names(self.steps, PER_SAMPLE_STAGE)
        return [StepName(DECODE_STAGE, DECODE_NAME), *rows]


def open_recipe(dataset: Any) -> Optional[Recipe]:
    """The dataset's recipe, opened into its steps where it can be; None when it has none."""
    for attr in RECIPE_ATTRS:
        value = getattr(dataset, attr, None)
        if value is None:
            continue
        steps = getattr(value, "transforms", None)
        if isinstance(steps, (list, tuple)) and steps and all(callable(s) for s in steps):
            return Recipe(attr, tuple(steps))
        if isinstance(value, (list, tuple)) and value and all(callable(s) for s in value):
            return Recipe(attr, tuple(value))
        if callable(value):
            reason = "a Compose-like without a list of steps" if hasattr(value, "transforms") else \
                "not a Compose or a list of callables"
            return Recipe(attr, (value,), reason)
        return None
    return None


class StepClock:
    """One process's timings of the recipe's steps since the last `drain`: one row a sample.

    Plain lists, not arrays, and the thread-CPU clock (a system call, ~0.5 us) read only at a
    sample's first step and its last: what attach adds to a sample stays a few microseconds."""

    def __init__(self, columns: int) -> None:
        self.columns = columns
        self.wall: List[List[int]] = []
        self.cpu: List[int] = []
        self._cpu_start = 0

    def start_sample(self) -> None:
        self.wall.append([0] * self.columns)
        self.cpu.append(0)
        self._cpu_start = time.thread_time_ns()

    def end_sample(self) -> None:
        self.cpu[-1] = time.thread_time_ns() - self._cpu_start

    def add(self, column: int, wall_ns: int) -> None:
        if not self.wall:  # a step called on its own, outside a sample the first step began
            self.start_sample()
        self.wall[-1][column] += wall_ns

    def drain(self) -> Tuple[np.ndarray, np.ndarray]:
        """([samples, columns] wall ns, [samples] CPU ns) since the last drain; empties the clock."""
        wall = np.array(self.wall, np.int64).reshape(len(self.wall), self.columns)
        cpu = np.array(self.cpu, np.int64)
        self.wall, self.cpu = [], []
        return wall, cpu


class TimedStep:
    """One step of the user's recipe, called as it was, its wall time recorded in `clock` at
    `column`. The first step (`first`) starts a sample's row and decodes a lazily opened image
    before it; the last (`last`) ends the sample's CPU time."""

    def __init__(self, step: Callable, clock: StepClock, column: int, first: bool, last: bool) -> None:
        self.step = step
        self.clock = clock
        self.column = column
        self.force_decode = first and not getattr(step, DECODES_ITSELF_ATTR, False)
        self.first = first
        self.last = last

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        clock = self.clock
        if self.first:
            clock.start_sample()
            if self.force_decode and args and undecoded(args[0]):
                start = time.perf_counter_ns()
                args[0].load()
                clock.add(DECODE_COLUMN, time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        out = self.step(*args, **kwargs)
        clock.add(self.column, time.perf_counter_ns() - start)
        if self.last:
            clock.end_sample()
        return out

    def __getattr__(self, name: str) -> Any:
        # What the user's code reads off a step (`.size`, `.p`) reads the step's own.
        if name == "step":
            raise AttributeError(name)
        return getattr(self.step, name)


class Riding:
    """A batch as the user's collate made it, with the timings of its samples beside it."""

    __slots__ = ("batch", "sample_ns", "sample_cpu_ns", "collate_ns", "collate_cpu_ns")

    def __init__(self, batch: Any, sample_ns: np.ndarray, sample_cpu_ns: np.ndarray, collate_ns: int,
                 collate_cpu_ns: int) -> None:
        self.batch = batch
        self.sample_ns = sample_ns
        self.sample_cpu_ns = sample_cpu_ns
        self.collate_ns = collate_ns
        self.collate_cpu_ns = collate_cpu_ns

    def __getstate__(self):
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state) -> None:
        for name, value in zip(self.__slots__, state):
            setattr(self, name, value)

    def pin_memory(self) -> "Riding":
        """torch's pin-memory thread pins the user's batch as it would have without the timings."""
        return Riding(pin_memory(self.batch), self.sample_ns, self.sample_cpu_ns, self.collate_ns,
                      self.collate_cpu_ns)


class RidingCollate:
    """The loader's collate_fn while watched: the user's own, timed, its batch riding with the timings."""

    def __init__(self, collate: Callable, clock: StepClock) -> None:
        self.collate = collate
        self.clock = clock

    def __call__(self, items: Any) -> Riding:
        cpu, start = time.thread_time_ns(), time.perf_counter_ns()
        batch = self.collate(items)
        collate_ns, collate_cpu_ns = time.perf_counter_ns() - start, time.thread_time_ns() - cpu
        sample_ns, sample_cpu_ns = self.clock.drain()
        return Riding(batch, sample_ns, sample_cpu_ns, collate_ns, collate_cpu_ns)


def _timed_copy(dataset: Any, recipe: Recipe, clock: StepClock) -> Any:
    """The recipe's value with its steps replaced by timed ones (a shallow copy: the user's object is not touched)."""
    last = len(recipe.steps)
    timed = [TimedStep(step, clock, column, column == 1, column == last)
             for column, step in enumerate(recipe.steps, start=1)]
    value = getattr(dataset, recipe.attr)
    if recipe.not_opened is not None:
        return timed[0]
    if isinstance(value, (list, tuple)):
        return type(value)(timed)
    twin = copy.copy(value)
    twin.transforms = type(value.transforms)(timed)
    return twin


@contextlib.contextmanager
def timed_recipe(loader: DataLoader) -> Iterator[Optional[Recipe]]:
    """Within the block the loader's recipe is timed and its collate carries the timings; yields the
    recipe (None when the dataset has none, or it could not be replaced: nothing is changed then).
    The dataset's attribute and the loader's collate_fn are restored on the way out."""
    dataset = loader.dataset
    recipe = open_recipe(dataset)
    if recipe is None:
        yield None
        return
    original, original_collate = getattr(dataset, recipe.attr), loader.collate_fn
    clock = StepClock(len(recipe.names))
    try:
        setattr(dataset, recipe.attr, _timed_copy(dataset, recipe, clock))
    except (AttributeError, TypeError, ValueError):  # a read-only attribute, a Compose that refuses a list
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            setattr(dataset, recipe.attr, original)
        yield None
        return
    loader.collate_fn = RidingCollate(original_collate, clock)
    try:
        yield recipe
    finally:
        setattr(dataset, recipe.attr, original)
        loader.collate_fn = original_collate


def collate_name(collate: Callable) -> str:
    """The collate row's name: the function's or the class's."""
    return getattr(collate, "__name__", type(collate).__name__)


def collate_step(loader_collate: Callable) -> Sequence[StepName]:
    """The per-batch rows of a watched loader: its collate alone."""
    collate = loader_collate.collate if isinstance(loader_collate, RidingCollate) else loader_collate
    return [StepName(COLLATE_STAGE, collate_name(collate))]
