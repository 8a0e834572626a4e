"""Per-step time inside a dataset that applies its own transforms, where `watch_chain` finds no
`transform` recipe: a WebDataset pipeline's stages and Hugging Face's `with_transform`.

A `wds.WebDataset(...)` is an IterableDataset whose `pipeline` list holds its stages (webdataset's
`FilterFunction`s). For the window that list is a copy (the user's stages are not touched) in which
- each user function of a `map`, `map_dict` or `map_tuple` stage is a `TimedStep`, a row each (a
  Compose-like opened into its steps, as `watch_chain` opens a recipe);
- each decode goes to the `decode` row: the fluid `.decode(...)` (a `map` of webdataset's `Decoder`)
  as a step, a `wds.decode(...)` stage as an `ExclusiveStage` (its pulls less its upstream's);
- a `SampleBoundary` before any `batched` / `unbatched` stage times each sample's whole pull: what the
  rows above did not take is the `load` row (the shards' reads, the tar parsing, the other stages).
Stages after the pipeline's own batching run once a batch, in no row.

Hugging Face's `Dataset.with_transform(fn)` calls `fn` once a fetch on a batch of columns: a
`BatchedStep` shares its time evenly among the batch's samples. HF's Dataset fetches its batches
itself (`__getitems__`), so there is no load row.

Both ride with the batch as `watch_chain`'s rows do (`watch_chain.ride`): the stages and steps are
plain picklable objects holding the one clock, so fork and spawn workers alike carry them.
"""

import contextlib
import copy
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from torch.utils.data import DataLoader, IterableDataset

from pipebench.attach.watch_chain import (
    DECODE_COLUMN,
    FIRST_STEP_COLUMN,
    Recipe,
    StepClock,
    TimedStep,
    Timing,
    callable_name,
    install,
    ride,
    subset_base,
    timed_loader,
)
from pipebench.pipeline.stages import DECODE_STAGE, LOAD_STAGE, PER_SAMPLE_STAGE
from pipebench.pipeline.timed_chain import DECODE_NAME, StepName, numbered

__all__ = ["BatchedStep", "ExclusiveStage", "SampleBoundary", "timed_any"]

# Where webdataset keeps its stage functions, and the names of those attach looks into.
WDS_FILTERS = "webdataset.filters"
MAP, MAP_DICT, MAP_TUPLE, DECODE = "_map", "_map_dict", "_map_tuple", "_decode"
# The fluid `.decode(...)` is a map of webdataset's own Decoder object: timed as the decode row.
WDS_AUTODECODE, DECODER = "webdataset.autodecode", "Decoder"
# Stages that make batches of samples (or take them apart): a sample's row ends before the first.
BATCHING = ("_batched", "_unbatched")
# Where a Compose keeps its steps (torchvision's v1 and v2 alike): a function there is opened into them.
RECIPE_STEPS_ATTR = "transforms"
# Keyword arguments of a map stage that are no user function.
NOT_STEPS = ("handler",)
# The attribute a WebDataset DataPipeline keeps its stages in.
PIPELINE_ATTR = "pipeline"
# Where Hugging Face's Dataset keeps with_transform's function: format_kwargs["transform"].
FORMAT_ATTR, FORMAT_TRANSFORM = "_format_kwargs", "transform"
# Why a Hugging Face dataset has no load row (the transform's rows stand).
HF_NO_LOAD = ("{name} fetches its batches itself (__getitems__): the Arrow read and the feature decoding before "
              "with_transform's function are in no row")
LOAD_NAME = "{name} (the shards' reads, the tar parsing and the pipeline's other stages)"
WDS_DECODE_NAME = "decode (the pipeline's .decode stage)"


class SampleBoundary:
    """The stage that ends a sample: each pull from upstream is one sample's row, begun before it and
    ended with its whole time (`StepClock.begin_item` / `end_item`: the rest of the row is the load)."""

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock

    def __call__(self, source: Any) -> Iterator[Any]:
        upstream = iter(source)
        while True:
            self.clock.begin_item()
            start = time.perf_counter_ns()
            try:
                sample = next(upstream)
            except StopIteration:  # the stream ended: no sample, no row
                self.clock.drop_item()
                return
            except BaseException:
                self.clock.drop_item()
                raise
            self.clock.end_item(time.perf_counter_ns() - start)
            yield sample


class _Pulls:
    """An iterator that counts the wall time spent in its source's next()."""

    def __init__(self, source: Any) -> None:
        self.source = iter(source)
        self.ns = 0

    def __iter__(self) -> "_Pulls":
        return self

    def __next__(self) -> Any:
        start = time.perf_counter_ns()
        try:
            return next(self.source)
        finally:
            self.ns += time.perf_counter_ns() - start


class ExclusiveStage:
    """A pipeline stage whose own time is timed into `column`: each output's pull less the time it
    spent pulling from upstream, so the upstream stages' time stays theirs."""

    def __init__(self, stage: Callable, clock: StepClock, column: int) -> None:
        self.stage = stage
        self.clock = clock
        self.column = column

    def __call__(self, source: Any) -> Iterator[Any]:
        pulls = _Pulls(source)
        outputs = iter(self.stage(pulls))
        while True:
            start, before = time.perf_counter_ns(), pulls.ns
            try:
                out = next(outputs)
            except StopIteration:
                return
            self.clock.add(self.column, time.perf_counter_ns() - start - (pulls.ns - before))
            yield out


class BatchedStep:
    """A transform called once for a batch of samples (a dict of columns, each a list): its wall and
    thread-CPU time, shared evenly among the batch's samples, one row each (`StepClock.add_samples`)."""

    def __init__(self, step: Callable, clock: StepClock, column: int) -> None:
        self.step = step
        self.clock = clock
        self.column = column

    def __call__(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        cpu, start = time.thread_time_ns(), time.perf_counter_ns()
        out = self.step(batch, *args, **kwargs)
        wall, cpu = time.perf_counter_ns() - start, time.thread_time_ns() - cpu
        self.clock.add_samples(self.column, wall, cpu, _batch_samples(batch))
        return out


def _batch_samples(batch: Any) -> int:
    """The samples in a batch of columns: the length of its first list; 1 for anything else."""
    first = next(iter(batch.values()), None) if isinstance(batch, dict) else None
    return max(len(first), 1) if isinstance(first, (list, tuple)) else 1


def _wds_kind(stage: Any) -> Optional[str]:
    """The name of a webdataset stage's function (`_map`, `_decode`, ...); None for any other stage."""
    f = getattr(stage, "f", None)
    if getattr(f, "__module__", None) != WDS_FILTERS or not hasattr(stage, "args") or not hasattr(stage, "kw"):
        return None
    return f.__name__


def _map_steps(stage: Any, kind: str) -> List[Tuple[str, Callable]]:
    """(where, function) of each user function a map stage holds: `map`'s one, `map_dict`'s by key,
    `map_tuple`'s by place; none for any other stage."""
    if kind == MAP:
        fn = stage.args[0] if stage.args else stage.kw.get("f")
        return [("map", fn)] if callable(fn) else []
    if kind == MAP_DICT:
        return [(f"map_dict {key}", fn) for key, fn in stage.kw.items() if key not in NOT_STEPS and callable(fn)]
    if kind == MAP_TUPLE:
        return [(f"map_tuple {place}", fn) for place, fn in enumerate(stage.args) if callable(fn)]
    return []


def _timed_map(stage: Any, kind: str, timed: Sequence[Callable]) -> Any:
    """A copy of a map stage whose user functions are `timed`, in `_map_steps`'s order."""
    steps = iter(timed)
    if kind == MAP and stage.args:
        args, kw = (next(steps), *stage.args[1:]), dict(stage.kw)
    elif kind == MAP:
        args, kw = stage.args, {**stage.kw, "f": next(steps)}
    elif kind == MAP_DICT:
        args = stage.args
        kw = {key: next(steps) if key not in NOT_STEPS and callable(fn) else fn for key, fn in stage.kw.items()}
    else:
        args, kw = tuple(next(steps) if callable(fn) else fn for fn in stage.args), dict(stage.kw)
    return type(stage)(stage.f, *args, **kw)


def _steps_of(fn: Callable) -> Tuple[Callable, ...]:
    """A Compose-like's steps (a `transforms` list or tuple of callables that a shallow copy of it
    takes in place); `(fn,)` for any other function, timed whole."""
    steps = getattr(fn, RECIPE_STEPS_ATTR, None)
    if not isinstance(steps, (list, tuple)) or not steps or not all(callable(step) for step in steps):
        return (fn,)
    try:  # a Compose that refuses its list replaced is timed whole
        setattr(copy.copy(fn), RECIPE_STEPS_ATTR, type(steps)(steps))
    except (AttributeError, TypeError, ValueError):
        return (fn,)
    return tuple(steps)


def _timed_function(fn: Callable, clock: StepClock, first_column: int) -> Callable:
    """`fn` timed into columns from `first_column`: whole as one `TimedStep`, or a Compose-like as a
    shallow copy whose steps are TimedSteps, a column each (the user's Compose is not touched)."""
    steps = _steps_of(fn)
    timed = [TimedStep(step, clock, column, False, False) for column, step in enumerate(steps, start=first_column)]
    if steps == (fn,):
        return timed[0]
    twin = copy.copy(fn)
    setattr(twin, RECIPE_STEPS_ATTR, type(getattr(fn, RECIPE_STEPS_ATTR))(timed))
    return twin


def _wds_pipeline(dataset: Any) -> Optional[List[Any]]:
    """The stages of a WebDataset pipeline (an IterableDataset whose `pipeline` holds webdataset stages)."""
    stages = getattr(dataset, PIPELINE_ATTR, None) if isinstance(dataset, IterableDataset) else None
    if not isinstance(stages, list) or not any(_wds_kind(stage) for stage in stages):
        return None
    return stages


def _decoder(fn: Callable) -> bool:
    """Whether a map stage's function is webdataset's own decoder (what the fluid `.decode()` maps)."""
    return type(fn).__module__ == WDS_AUTODECODE and type(fn).__name__ == DECODER


def _timed_pipeline(dataset: Any, stages: List[Any]) -> Tuple[List[Any], StepClock, Recipe, Tuple[StepName, ...]]:
    """The pipeline's timed copy, its clock, the user's functions as a recipe and the rows' names."""
    kinds = [_wds_kind(stage) for stage in stages]
    end = next((k for k, kind in enumerate(kinds) if kind in BATCHING), len(stages))
    mapped = [(k, where, fn) for k, stage in enumerate(stages[:end]) for where, fn in _map_steps(stage, kinds[k] or "")]
    found = [(k, where, fn) for k, where, fn in mapped if not _decoder(fn)]
    # A row a step: a Compose-like function opened into its steps.
    steps = [(where, step) for _, where, fn in found for step in _steps_of(fn)]
    clock = StepClock(FIRST_STEP_COLUMN + len(steps))
    column = FIRST_STEP_COLUMN
    timed: Dict[int, List[Callable]] = {}
    for k, _, fn in mapped:
        if _decoder(fn):
            timed.setdefault(k, []).append(TimedStep(fn, clock, DECODE_COLUMN, False, False))
            continue
        timed.setdefault(k, []).append(_timed_function(fn, clock, column))
        column += len(_steps_of(fn))
    stages_copy = [_timed_map(stage, kinds[k], timed[k]) if k in timed else
                   ExclusiveStage(stage, clock, DECODE_COLUMN) if kinds[k] == DECODE and k < end else stage
                   for k, stage in enumerate(stages)]
    stages_copy.insert(end, SampleBoundary(clock))
    names = numbered([f"{callable_name(step)} ({where})" for where, step in steps])
    rows = (StepName(LOAD_STAGE, LOAD_NAME.format(name=type(dataset).__name__)), StepName(DECODE_STAGE, WDS_DECODE_NAME),
            *(StepName(PER_SAMPLE_STAGE, name) for name in names))
    return stages_copy, clock, Recipe(PIPELINE_ATTR, tuple(step for _, step in steps)), rows


def _format_transform(dataset: Any) -> Optional[Callable]:
    """Hugging Face's with_transform function (`_format_kwargs["transform"]`), where the dataset has one."""
    kwargs = getattr(dataset, FORMAT_ATTR, None)
    fn = kwargs.get(FORMAT_TRANSFORM) if isinstance(kwargs, dict) else None
    return fn if callable(fn) else None


@contextlib.contextmanager
def timed_any(loader: DataLoader) -> Iterator[Timing]:
    """`watch_chain.timed_loader`, or within the block the steps of a dataset that applies its own
    transforms timed where they can be found: a WebDataset pipeline's stages, Hugging Face's
    with_transform function (see the module doc). What was changed is restored on the way out."""
    dataset = subset_base(loader.dataset)
    stages, transform = _wds_pipeline(dataset), _format_transform(dataset)
    with contextlib.ExitStack() as restore:
        changed = False
        if stages is not None:
            timed_stages, clock, recipe, names = _timed_pipeline(dataset, stages)
            changed, load_note = install(restore, dataset, PIPELINE_ATTR, timed_stages), None
        elif transform is not None:
            clock = StepClock(FIRST_STEP_COLUMN + 1)
            recipe = Recipe(FORMAT_ATTR, (transform,))
            names = (StepName(LOAD_STAGE, type(dataset).__name__), StepName(DECODE_STAGE, DECODE_NAME),
                     StepName(PER_SAMPLE_STAGE, f"{callable_name(transform)} (with_transform)"))
            timed = BatchedStep(transform, clock, FIRST_STEP_COLUMN)
            changed = install(restore, dataset, FORMAT_ATTR, {**getattr(dataset, FORMAT_ATTR), FORMAT_TRANSFORM: timed})
            load_note = HF_NO_LOAD.format(name=type(dataset).__name__)
        if changed:
            ride(restore, loader, clock)
            yield Timing(recipe, names, load_note)
            return
    with timed_loader(loader) as timing:  # none found, or the dataset refused its timed copy
        yield timing
