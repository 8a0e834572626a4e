"""Did every sample index arrive exactly once per epoch, across every rank and worker?

Each rank logs the indices of every batch it received, by epoch. Pooled, an epoch every rank
finished must hold each index exactly once: a duplicate means two ranks or workers read the same
sample (no DistributedSampler, an IterableDataset not sharded by worker), a miss a sample nobody
read. The last, unfinished epoch is checked for duplicates only.

Under loader.drop_last=true each reader drops the tail that does not fill its last batch, so an
epoch whose misses that allowance covers counts them as `dropped_last`, a known loss; only misses
beyond it are `missing`. A sample that raised and run.on_error=skip dropped counts as `skipped`.
"""

from collections import Counter
from dataclasses import asdict, dataclass
from typing import (
    Any,
    Dict,
    Hashable,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from pipebench.base.typed_json import parse_all
from pipebench.config.specs import JobSpec
from pipebench.measure.meter import Meter

# Indices listed by value in the report; the counts cover all of them.
MAX_LISTED_INDICES = 10


@dataclass(frozen=True)
class CoverageReport:
    """Totals over the checked epochs: `complete_epochs` for duplicates and misses, `partial_epochs`
    for duplicates only. `droppable`: the misses an epoch drop_last may explain; `dropped_last`: the
    misses of the epochs it explains; `missing`: every other miss, which no setting explains."""

    length: int
    complete_epochs: int
    partial_epochs: int
    samples_seen: int
    duplicates: int
    missing: int
    droppable: int
    duplicate_examples: Tuple[int, ...]
    missing_examples: Tuple[int, ...]
    dropped_last: int = 0
    skipped: int = 0

    @property
    def exactly_once(self) -> bool:
        return self.duplicates == 0 and self.missing == 0

    def as_dict(self) -> dict:
        return {**asdict(self), "exactly_once": self.exactly_once}

    def columns(self) -> Dict[str, int]:
        """The summary's cells."""
        return {"duplicate_samples": self.duplicates, "missed_samples": self.missing,
                "dropped_last_samples": self.dropped_last}

    def describe(self) -> str:
        """One line for the job's output."""
        checked = f"{self.complete_epochs} complete + {self.partial_epochs} partial epoch(s)"
        dropped = (f"; {self.dropped_last} in last batches loader.drop_last=true drops, up to {self.droppable} "
                   "an epoch" if self.dropped_last else "")
        if self.exactly_once:
            return f"coverage: every index exactly once ({checked}, {self.samples_seen} samples{dropped})"
        parts = []
        if self.duplicates:
            parts.append(f"{self.duplicates} duplicate reads (e.g. {list(self.duplicate_examples)})")
        if self.missing:
            parts.append(f"{self.missing} missed indices that drop_last does not explain (e.g. "
                         f"{list(self.missing_examples)}; it explains up to {self.droppable} per epoch)")
        return f"coverage: {'; '.join(parts)} ({checked}{dropped})"


class IndexLog(Meter):
    """A StepLoop `on_batch` hook: the sample indices of every batch a process received, by (repeat,
    epoch), about a microsecond a step. As a Meter it checks its own log given the dataset's
    `length`; ranks build it without one, and their logs are pooled instead (`merge_logs`). It
    ignores the marks: every batch counts, warm-up included, since every read is a read."""

    key = "coverage"

    def __init__(self, length: Optional[int] = None, droppable: int = 0) -> None:
        self.repeat = 0
        self.parts: Dict[Tuple[int, int], list] = {}
        self.length = length
        self.droppable = droppable
        # The epoch each repeat had reached at its last batch: BatchStream counts an epoch only
        # when it returns that epoch's first batch, so this equals the stream's own count.
        self.reached: Dict[int, int] = {}
        # The indices of samples that raised, which run.on_error=skip dropped from their batch.
        self.failed: Dict[Tuple[int, int], List[int]] = {}
        self._report: Optional[CoverageReport] = None

    def __call__(self, batch, epoch: int) -> None:
        self.parts.setdefault((self.repeat, epoch), []).append(batch.indices)
        self.reached[self.repeat] = epoch
        for failure in getattr(batch, "failures", ()):
            self.failed.setdefault((self.repeat, epoch), []).append(int(failure.index))

    def stop(self) -> None:
        if self.length is not None:
            reached = [self.reached.get(r, 0) for r in range(max(self.reached, default=-1) + 1)]
            self._report = check_coverage(self.mapping(), self.length, complete_epochs([reached]), self.droppable,
                                          self.failed)

    def columns(self) -> Dict[str, Optional[int]]:
        if self._report is None:
            return {"duplicate_samples": None, "missed_samples": None, "dropped_last_samples": None}
        return self._report.columns()

    def record(self) -> Dict[str, Any]:
        return self._report.as_dict() if self._report else {}

    def mapping(self) -> Dict[Tuple[int, int], List[int]]:
        return {key: [int(i) for part in parts for i in part] for key, parts in sorted(self.parts.items())}

    def as_json(self) -> List[dict]:
        return [asdict(EpochIndices(r, e, indices)) for (r, e), indices in self.mapping().items()]


@dataclass(frozen=True)
class EpochIndices:
    """One epoch of one repeat in a rank's `indices` section: the indices it read, in order."""

    repeat: int
    epoch: int
    indices: Sequence[int]


def log_from_json(entries: Sequence[Mapping[str, Any]]) -> Dict[Tuple[int, int], List[int]]:
    return {(e.repeat, e.epoch): list(e.indices) for e in parse_all(EpochIndices, entries)}


def complete_epochs(epochs_reached: Sequence[Sequence[int]]) -> set:
    """(repeat, epoch) keys every process went past. `epochs_reached[p][r]`: the epoch process p
    was in when repeat r stopped (epochs count from 1, as BatchStream counts them)."""
    repeats = min(len(reached) for reached in epochs_reached)
    return {(r, e) for r in range(repeats) for e in range(1, min(reached[r] for reached in epochs_reached))}


def droppable_per_epoch(spec: JobSpec, iterable: bool) -> int:
    """An upper bound on the samples drop_last may leave unread an epoch: under a batch per shard,
    DistributedSampler's tail included. A map-style dataset is split by each rank's sampler; a stream
    (`iterable`) by every worker's copy of it on every rank."""
    shards = spec.distributed.nproc * (max(spec.workers, 1) if iterable else 1)
    return shards * spec.loader.batch_size if spec.loader.drop_last else 0


def merge_logs(logs: Iterable[Mapping[Hashable, Sequence[int]]]) -> Dict[Hashable, List[int]]:
    """Pool per-rank logs (epoch key -> indices) into one epoch key -> indices mapping.
    An epoch key is anything hashable and sortable, e.g. (repeat, epoch)."""
    pooled: Dict[Hashable, List[int]] = {}
    for log in logs:
        for epoch, indices in log.items():
            pooled.setdefault(epoch, []).extend(int(i) for i in indices)
    return pooled


def check_coverage(epochs: Mapping[Hashable, Sequence[int]], length: int, complete: Iterable[Hashable],
                   droppable: int = 0, failed: Optional[Mapping[Hashable, Sequence[int]]] = None) -> CoverageReport:
    """Check pooled indices per epoch against `range(length)`; only the `complete` epochs (every
    rank finished them) for misses. Indices outside the dataset count as duplicates: reads an
    exactly-once epoch cannot hold."""
    complete = set(complete)
    failed = failed or {}
    duplicates = missing = dropped = skipped = seen = 0
    dup_examples: List[int] = []
    miss_examples: List[int] = []
    for epoch in sorted(epochs):
        counts = Counter(epochs[epoch])
        seen += sum(counts.values())
        extra = sorted(i for i, n in counts.items() if n > 1 or not 0 <= i < length)
        duplicates += sum(counts[i] - (1 if 0 <= i < length else 0) for i in extra)
        dup_examples.extend(extra[:MAX_LISTED_INDICES - len(dup_examples)])
        if epoch in complete:
            raised = set(failed.get(epoch, ()))
            absent = [i for i in range(length) if i not in counts and i not in raised]
            skipped += len(raised.difference(counts))
            if len(absent) <= droppable:
                dropped += len(absent)
                continue
            missing += len(absent)
            miss_examples.extend(absent[:MAX_LISTED_INDICES - len(miss_examples)])
    checked = set(epochs)
    return CoverageReport(
        length=length,
        complete_epochs=len(checked & complete),
        partial_epochs=len(checked - complete),
        samples_seen=seen,
        duplicates=duplicates,
        missing=missing,
        droppable=droppable,
        duplicate_examples=tuple(dup_examples),
        missing_examples=tuple(miss_examples),
        dropped_last=dropped,
        skipped=skipped,
    )
