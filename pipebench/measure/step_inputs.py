"""Each step of a job's chain with the inputs it saw: the chain run once on the dataset's first
samples, every step's input kept, so a step can be called again alone (the thread profile).

Steps carry the names the transforms.csv rows use, from the load (an index in) to the collate (a
batch of the captured samples) and the per-batch steps.
"""

from dataclasses import dataclass
from itertools import cycle, islice
from typing import Any, Callable, List, Optional, Sequence, Tuple

from torch.utils.data import default_collate

from pipebench.pipeline.timed_chain import InstrumentedDataset, TimedCollate, undecoded

__all__ = ["CAPTURED_SAMPLES", "Captured", "StepCall", "capture_steps"]

# Samples the chain runs on to capture inputs: enough that a cost that varies by sample (image
# size, a random crop) is averaged over several, few enough that keeping every step's input of
# each costs a few images' memory.
CAPTURED_SAMPLES = 8


@dataclass(frozen=True)
class StepCall:
    """One step to call alone: `call(x)` for x in `inputs`, reused round-robin. A step that uses up
    its input (a lazy image's decode) has `fresh` instead: `fresh(i)` makes the i-th input anew,
    outside the timed call."""

    stage: str
    name: str
    call: Callable[[Any], Any]
    inputs: Tuple[Any, ...] = ()
    fresh: Optional[Callable[[int], Any]] = None

    def inputs_for(self, calls: int) -> Sequence[Any]:
        """`calls` inputs, in order: fresh ones, or the captured ones repeated."""
        if self.fresh is not None:
            return [self.fresh(i) for i in range(calls)]
        return list(islice(cycle(self.inputs), calls))


@dataclass(frozen=True)
class Captured:
    """The steps with their inputs, and why some or all could not be captured ('' when all were)."""

    steps: Tuple[StepCall, ...]
    note: str = ""


def _decode(image: Any) -> None:
    image.load()


def _sample_chain(dataset: InstrumentedDataset, indices: Sequence[int]) -> Tuple[List[List[Any]], List[Any], str]:
    """Per step of the per-sample chain (load, decode, transforms), its inputs; the finished
    (sample, target) items; the first failure's line."""
    base, transforms = dataset.base, dataset.transforms
    steps: List[List[Any]] = [[] for _ in range(2 + len(transforms))]
    items, failure = [], ""
    for index in indices:
        try:
            sample, target = base[index]
            decoded = dataset.force_decode and undecoded(sample)
            if decoded:
                sample.load()
            seen = [sample]
            for transform in transforms:
                sample = transform(sample)
                seen.append(sample)
        except Exception as exc:  # a bad sample: the next one stands in for it
            failure = failure or f"sample {index}: {type(exc).__name__}: {exc}"
            continue
        steps[0].append(index)
        if decoded:
            steps[1].append(index)
        for i, value in enumerate(seen[:-1]):
            steps[2 + i].append(value)
        items.append((sample, target))
    return steps, items, failure


def capture_steps(dataset: InstrumentedDataset, collate: TimedCollate, batch_size: int) -> Captured:
    """Run the chain on the dataset's first CAPTURED_SAMPLES samples and keep each step's inputs."""
    indices = list(range(min(CAPTURED_SAMPLES, len(dataset))))
    inputs, items, failure = _sample_chain(dataset, indices)
    if not items:
        return Captured((), f"no sample ran through the chain ({failure or 'the dataset is empty'})")
    base = dataset.base
    load, decode, *per_sample = dataset.steps
    calls = [StepCall(load.stage, load.name, base.__getitem__, tuple(inputs[0]))]
    if inputs[1]:
        opened = inputs[1]
        calls.append(StepCall(decode.stage, decode.name, _decode,
                              fresh=lambda i: base[opened[i % len(opened)]][0]))
    calls += [StepCall(step.stage, step.name, transform, tuple(seen))
              for step, transform, seen in zip(per_sample, dataset.transforms, inputs[2:])]
    batch = list(islice(cycle(items), batch_size))
    collate_step, *per_batch = collate.steps
    calls.append(StepCall(collate_step.stage, collate_step.name, default_collate, (batch,)))
    data, note = default_collate(batch)[0], ""
    for step, transform in zip(per_batch, collate.transforms):
        try:
            out = transform(data)
        except Exception as exc:  # it and the steps after it have no input to be called on
            note = f"per-batch step {step.name} failed on the captured batch: {type(exc).__name__}: {exc}"
            break
        calls.append(StepCall(step.stage, step.name, transform, (data,)))
        data = out
    return Captured(tuple(calls), note or (f"some samples failed ({failure})" if failure else ""))
