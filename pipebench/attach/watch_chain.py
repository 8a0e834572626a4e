"""Per-transform time inside the workers of a watched loader, with the user's results unchanged.

`timed_loader` opens the dataset's recipe (`dataset.transform`, else `.transforms`: a Compose-like
with a `transforms` list, or a list of callables) and puts a shallow copy in its place whose steps
are `TimedStep`s, each recording its wall time (and the sample's thread-CPU time) into the recipe's
`StepClock`. A lazily opened PIL image reaching the first step is decoded first, as its own `decode`
row (the timed chain's rule, `timed_chain.undecoded`). A recipe that cannot be opened is timed whole,
as one row whose name says why.

Each sample's whole `__getitem__` is timed too (`first_batch.TimedItems`): what the recipe's steps
leave of it is the `load` row, so the rows add up to the sample's time. An ImageFolder's file
`loader` (the read and decode inside `__getitem__`, before the recipe) is the decode row. A loader
over `Subset`s is looked into (the dataset they select from); a `ConcatDataset`'s recipes are timed
where they are one recipe, else their time is the load row's, whose name says so. A
`target_transform` is a row of its own. `Timing.rows_note` says why rows are missing.

The timings ride with the batch, as `timed_chain`'s do: `RidingCollate` replaces `loader.collate_fn`,
calls the user's collate (the `collate` row) and returns a `Riding` (batch, timings), which the watch
strips in the main process. The clock, steps and collate are plain picklable objects, and one pickle
holds the dataset and its clock, so under fork and spawn alike each worker's copies stay one object.
"""

import contextlib
import copy
import functools
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from torch.utils.data import ConcatDataset, DataLoader, IterableDataset, Subset
from torch.utils.data._utils.pin_memory import pin_memory

from pipebench.attach.first_batch import StampedInit, Startup, TimedItems
from pipebench.pipeline.stages import COLLATE_STAGE, DECODE_STAGE, LOAD_STAGE, PER_SAMPLE_STAGE
from pipebench.pipeline.timed_chain import DECODE_NAME, DECODES_ITSELF_ATTR, StepName, step_names, undecoded

__all__ = ["Recipe", "Riding", "RidingCollate", "StepClock", "TimedStep", "Timing", "install", "open_recipe",
           "recipe_holders", "ride", "shared_recipe", "subset_base", "timed_loader"]

# The attributes a dataset's recipe is looked for under, in this order: torchvision's
# VisionDataset sets both, `transforms` to a StandardTransform of `transform`, which it calls.
RECIPE_ATTRS = ("transform", "transforms")
# Column 0 of a sample's timings is its load (its __getitem__ less the recipe's steps), column 1
# the forced decode; the recipe's steps follow.
LOAD_COLUMN, DECODE_COLUMN, FIRST_STEP_COLUMN = 0, 1, 2
# The attribute torch's map-style fetcher calls, where a dataset has it, with a batch's indices.
GETITEMS_ATTR = "__getitems__"
# Where torchvision's datasets keep the label's transform, called after the recipe.
TARGET_ATTR = "target_transform"
# The load row's name where a ConcatDataset's datasets hold different recipes.
RECIPES_DIFFER = "its datasets' recipes differ: timed whole in this row"
# Where a dataset's recipe was not timed, and why.
NO_RECIPE = ("the dataset holds no transform or transforms recipe attach can open (a transform applied in the "
             "dataset's own code is not seen)")
RECIPE_REFUSED = "the dataset refused the recipe's timed copy"
# Where torchvision's DatasetFolder (ImageFolder) keeps the function that reads and decodes a file.
FILE_LOADER_ATTR = "loader"


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
        # Inside a sample's __getitem__ (TimedItems): the item, not the recipe, owns the sample's row.
        self.in_item = False
        # This process's start (a worker's StampedInit) and its first sample's fetch, sent once.
        self.started_ns: Optional[int] = None
        self.first_fetch_ns: Optional[int] = None
        self._startup_sent = False

    def start_sample(self) -> None:
        self.wall.append([0] * self.columns)
        self.cpu.append(0)
        self._cpu_start = time.thread_time_ns()

    def end_sample(self) -> None:
        self.cpu[-1] = time.thread_time_ns() - self._cpu_start

    def begin_item(self) -> None:
        """A sample's __getitem__ begins: its row starts here, so the recipe inside it adds to it."""
        self.start_sample()
        self.in_item = True

    def end_item(self, total_ns: int) -> None:
        """The sample's __getitem__ took `total_ns`: what its recipe steps did not take is its load."""
        row = self.wall[-1]
        row[LOAD_COLUMN] = max(total_ns - sum(row[DECODE_COLUMN:]), 0)
        self.end_sample()
        self.in_item = False
        if self.first_fetch_ns is None:
            self.first_fetch_ns = total_ns

    def drop_item(self) -> None:
        """The sample begun by `begin_item` never came (its stream ended, or it raised): its row goes."""
        self.wall.pop()
        self.cpu.pop()
        self.in_item = False

    def add_samples(self, column: int, wall_ns: int, cpu_ns: int, samples: int) -> None:
        """A step called once for `samples` samples (a transform given a batch) took `wall_ns` and
        `cpu_ns`: one row a sample, each with its even share."""
        for _ in range(samples):
            row = [0] * self.columns
            row[column] = wall_ns // samples
            self.wall.append(row)
            self.cpu.append(cpu_ns // samples)

    def take_startup(self) -> Optional[Startup]:
        """This process's start and first fetch, the first time it is asked; None after."""
        if self._startup_sent:
            return None
        self._startup_sent = True
        return Startup(os.getpid(), self.started_ns, self.first_fetch_ns)

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
            if not clock.in_item:
                clock.start_sample()
            if self.force_decode and args and undecoded(args[0]):
                start = time.perf_counter_ns()
                args[0].load()
                clock.add(DECODE_COLUMN, time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        out = self.step(*args, **kwargs)
        clock.add(self.column, time.perf_counter_ns() - start)
        if self.last and not clock.in_item:
            clock.end_sample()
        return out

    def __getattr__(self, name: str) -> Any:
        # What the user's code reads off a step (`.size`, `.p`) reads the step's own.
        if name == "step":
            raise AttributeError(name)
        return getattr(self.step, name)


class Riding:
    """A batch as the user's collate made it, with the timings of its samples beside it (and, on
    a process's first batch, its `Startup`)."""

    __slots__ = ("batch", "sample_ns", "sample_cpu_ns", "collate_ns", "collate_cpu_ns", "startup")

    def __init__(self, batch: Any, sample_ns: np.ndarray, sample_cpu_ns: np.ndarray, collate_ns: int,
                 collate_cpu_ns: int, startup: Optional[Startup] = None) -> None:
        self.batch = batch
        self.sample_ns = sample_ns
        self.sample_cpu_ns = sample_cpu_ns
        self.collate_ns = collate_ns
        self.collate_cpu_ns = collate_cpu_ns
        self.startup = startup

    def __getstate__(self):
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state) -> None:
        for name, value in zip(self.__slots__, state):
            setattr(self, name, value)

    def pin_memory(self) -> "Riding":
        """torch's pin-memory thread pins the user's batch as it would have without the timings."""
        return Riding(pin_memory(self.batch), self.sample_ns, self.sample_cpu_ns, self.collate_ns,
                      self.collate_cpu_ns, self.startup)


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
        return Riding(batch, sample_ns, sample_cpu_ns, collate_ns, collate_cpu_ns, self.clock.take_startup())


def _timed_copy(dataset: Any, recipe: Recipe, clock: StepClock) -> Any:
    """The recipe's value with its steps replaced by timed ones (a shallow copy: the user's object is not touched)."""
    last = FIRST_STEP_COLUMN + len(recipe.steps) - 1
    timed = [TimedStep(step, clock, column, column == FIRST_STEP_COLUMN, column == last)
             for column, step in enumerate(recipe.steps, start=FIRST_STEP_COLUMN)]
    value = getattr(dataset, recipe.attr)
    if recipe.not_opened is not None:
        return timed[0]
    if isinstance(value, (list, tuple)):
        return type(value)(timed)
    twin = copy.copy(value)
    twin.transforms = type(value.transforms)(timed)
    return twin


@dataclass(frozen=True)
class Timing:
    """What `timed_loader` put in place: the recipe (None: none found, or it refused its copy, as
    `recipe_note` says), the rows (load, decode, the recipe's steps, the target_transform; none
    when nothing could be timed), and whether the load is timed, or why not."""

    recipe: Optional[Recipe]
    names: Tuple[StepName, ...]
    load_note: Optional[str]
    recipe_note: Optional[str] = None

    @property
    def timed(self) -> bool:
        """Whether anything was timed (else nothing was changed)."""
        return bool(self.names)

    @property
    def rows_note(self) -> Optional[str]:
        """Why the rows miss part of a sample's time, in one phrase; None when they hold all of it."""
        if not self.timed:
            return f"no transform rows: {self.load_note}, and {self.recipe_note}"
        if self.load_note is not None:
            return f"no load row: {self.load_note}; the rows hold the recipe, not the sample's whole time"
        if self.recipe is None and self.recipe_note != RECIPES_DIFFER:
            return f"no recipe rows: {self.recipe_note}; the load row holds the sample's whole __getitem__"
        return None


def subset_base(dataset: Any) -> Any:
    """The dataset a chain of torch `Subset`s selects from; the dataset itself when it is none."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return dataset


def recipe_holders(dataset: Any) -> List[Any]:
    """The datasets that hold a sample's recipe: the dataset (its Subsets' base), or each dataset
    of a ConcatDataset (nested ones and their Subsets opened too)."""
    dataset = subset_base(dataset)
    if isinstance(dataset, ConcatDataset):
        return [holder for member in dataset.datasets for holder in recipe_holders(member)]
    return [dataset]


def shared_recipe(holders: Sequence[Any]) -> Tuple[List[Tuple[Any, Recipe]], bool]:
    """(holder, its recipe) for each holder with one, and whether they are one recipe: the same
    attribute and the same rows, so each holder's timed copy can write the same columns."""
    found = [(holder, recipe) for holder in holders for recipe in [open_recipe(holder)] if recipe is not None]
    shapes = {(recipe.attr, tuple(recipe.names)) for _, recipe in found}
    return found, len(shapes) <= 1 and (not found or len(found) == len(holders))


def _shared_target(holders: Sequence[Any]) -> Optional[str]:
    """The name of the holders' target_transform where each has one of the same class; else None."""
    names = {type(getattr(holder, TARGET_ATTR, None)).__name__ for holder in holders}
    if len(names) != 1 or not all(callable(getattr(holder, TARGET_ATTR, None)) for holder in holders):
        return None
    return f"{names.pop()} ({TARGET_ATTR})"


def _load_refusal(loader: DataLoader, dataset: Any) -> Optional[str]:
    """Why a sample's __getitem__ cannot be timed on this loader over `dataset` (its Subsets'
    base); None when it can."""
    if isinstance(dataset, IterableDataset):
        return "an IterableDataset has no __getitem__"
    if loader.batch_sampler is None:
        return "batch_size=None: torch's fetcher indexes the dataset itself"
    if getattr(type(dataset), GETITEMS_ATTR, None) is not None or GETITEMS_ATTR in getattr(dataset, "__dict__", {}):
        return f"{type(dataset).__name__} fetches its batches itself (__getitems__)"
    return None


def install(stack: contextlib.ExitStack, dataset: Any, attr: str, value: Any) -> bool:
    """Set `dataset.attr` to `value` until `stack` closes; False (nothing changed) where the dataset
    refuses it."""
    original = getattr(dataset, attr)
    try:
        setattr(dataset, attr, value)
    except (AttributeError, TypeError, ValueError):  # a read-only attribute, a Compose that refuses a list
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            setattr(dataset, attr, original)
        return False
    stack.callback(setattr, dataset, attr, original)
    return True


def _install_each(restore: contextlib.ExitStack,
                  changes: Sequence[Tuple[Any, str, Callable[[], Any]]]) -> bool:
    """Set each (dataset, attribute) to what its function makes until `restore` closes; False (every
    one already put back) where one is refused."""
    with contextlib.ExitStack() as stack:
        for dataset, attr, make in changes:
            try:
                value = make()
            except (AttributeError, TypeError, ValueError):  # a Compose that refuses a list of steps
                return False
            if not install(stack, dataset, attr, value):
                return False
        restore.enter_context(stack.pop_all())
        return True


def _install_items(restore: contextlib.ExitStack, dataset: Any, clock: StepClock) -> Optional[str]:
    """Set the timed __getitems__ on the dataset instance until `restore` closes; why not, where it
    refuses."""
    try:
        setattr(dataset, GETITEMS_ATTR, TimedItems(dataset, clock))
    except (AttributeError, TypeError, ValueError) as exc:  # __slots__, a __setattr__ of its own
        return f"the dataset refuses an attribute: {exc}"
    restore.callback(_remove_items, dataset)
    return None


@contextlib.contextmanager
def timed_loader(loader: DataLoader) -> Iterator[Timing]:
    """Within the block the loader's samples are timed (load, recipe steps, target_transform, an
    ImageFolder's file loader), its collate carries the timings and its workers stamp their start, all
    restored on the way out; yields the `Timing` (no rows, and nothing changed, where nothing can be)."""
    dataset = subset_base(loader.dataset)
    holders = recipe_holders(dataset)
    found, shared = shared_recipe(holders)
    recipe = found[0][1] if found and shared else None
    recipe_note = None if recipe is not None else RECIPES_DIFFER if found else NO_RECIPE
    target = _shared_target(holders)
    with contextlib.ExitStack() as restore:
        # Columns: the load, the decode, the recipe's steps, then the target_transform.
        columns = FIRST_STEP_COLUMN + (target is not None)
        clock = StepClock(columns + (len(recipe.steps) if recipe is not None else 0))
        copies = [(holder, r.attr, functools.partial(_timed_copy, holder, r, clock)) for holder, r in found]
        if recipe is not None and not _install_each(restore, copies):  # refused: the clock loses its columns
            recipe, clock, recipe_note = None, StepClock(columns), RECIPE_REFUSED
        load_note = _load_refusal(loader, dataset) or _install_items(restore, dataset, clock)
        if recipe is None and load_note is not None:
            yield Timing(None, (), load_note, recipe_note)
            return
        # The file loader runs inside a sample's timed __getitem__, whose row it then splits.
        decode_name = _timed_file_loaders(restore, holders, clock) if load_note is None else None
        if target is not None and not _timed_attribute(restore, holders, TARGET_ATTR, clock,
                                                       column=clock.columns - 1):
            target = None  # refused: its column stays empty
        load_name = type(dataset).__name__ + (f" ({RECIPES_DIFFER})" if found and not shared else "")
        decode = StepName(DECODE_STAGE, decode_name or DECODE_NAME)
        names = (StepName(LOAD_STAGE, load_name), decode, *(recipe.names[1:] if recipe is not None else []),
                 *([StepName(PER_SAMPLE_STAGE, target)] if target is not None else []))
        ride(restore, loader, clock)
        yield Timing(recipe, names, load_note, recipe_note)


def ride(restore: contextlib.ExitStack, loader: DataLoader, clock: StepClock) -> None:
    """Until `restore` closes, the loader's batches carry `clock`'s timings (`RidingCollate`) and its
    workers stamp their start (`StampedInit`)."""
    restore.callback(setattr, loader, "collate_fn", loader.collate_fn)
    restore.callback(setattr, loader, "worker_init_fn", loader.worker_init_fn)
    loader.collate_fn = RidingCollate(loader.collate_fn, clock)
    if loader.num_workers > 0:
        loader.worker_init_fn = StampedInit(loader.worker_init_fn, clock)


def _timed_attribute(restore: contextlib.ExitStack, holders: Sequence[Any], attr: str, clock: StepClock,
                     column: int) -> bool:
    """Each holder's callable `attr` replaced by a TimedStep into `column` (`_install_each`)."""
    timed = [(holder, attr, functools.partial(TimedStep, getattr(holder, attr), clock, column, False, False))
             for holder in holders]
    return _install_each(restore, timed)


def _timed_file_loaders(restore: contextlib.ExitStack, holders: Sequence[Any], clock: StepClock) -> Optional[str]:
    """Time each holder's file loader (FILE_LOADER_ATTR: torchvision's DatasetFolder reads and decodes
    a file with it) in the decode column until `restore` closes; the decode row's name, or None where
    a holder has none (or refuses its timed copy)."""
    loaders = [getattr(holder, FILE_LOADER_ATTR, None) for holder in holders]
    if not all(callable(one) and not isinstance(one, DataLoader) for one in loaders):
        return None
    if not _timed_attribute(restore, holders, FILE_LOADER_ATTR, clock, DECODE_COLUMN):
        return None
    names = ", ".join(sorted({callable_name(one) for one in loaders}))
    return f"{names} ({type(holders[0]).__name__}.{FILE_LOADER_ATTR}: the file's read and decode)"


def _remove_items(dataset: Any) -> None:
    with contextlib.suppress(AttributeError):
        delattr(dataset, GETITEMS_ATTR)


def callable_name(step: Callable) -> str:
    """A row's name for a callable (the collate, a file loader): the function's or the class's."""
    return getattr(step, "__name__", type(step).__name__)


def collate_step(loader_collate: Callable) -> Sequence[StepName]:
    """The per-batch rows of a watched loader: its collate alone."""
    collate = loader_collate.collate if isinstance(loader_collate, RidingCollate) else loader_collate
    return [StepName(COLLATE_STAGE, callable_name(collate))]
