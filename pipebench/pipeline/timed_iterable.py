"""The timed chain for an IterableDataset: the stream decides which samples each worker reads.

An iterable dataset for pipebench yields `(index, sample, target)`: the index is the sample's
place in the epoch's full set, so the exactly-once check (pipebench.measure.coverage) can see whether
the stream shards itself correctly by rank and worker. The load step is the time `next()` on
the stream takes. Items have the same shape as InstrumentedDataset's, so TimedCollate and the
step loop handle both alike; they come out of the same per-sample path (`timed_item`), so a
stream's steps get profiler labels and viztrace slices as a map-style dataset's do.
"""

from typing import Any, Iterator, Tuple

from torch.utils.data import IterableDataset

from pipebench.pipeline.timed_chain import InstrumentedDataset, StreamEnd

# Index reported when pulling the next item from the stream fails: the stream never said which.
UNKNOWN_INDEX = -1


class InstrumentedIterable(InstrumentedDataset, IterableDataset):
    """Wraps an IterableDataset of `(index, sample, target)`; yields the timed items.

    Inherits the step names, `describe` and pickling from InstrumentedDataset; a bad sample
    becomes a SampleFailure in the stream, as in the map-style wrapper.
    """

    def __getitem__(self, index: int):
        raise TypeError("an iterable dataset is read by iterating it")

    def __iter__(self) -> Iterator:
        source = iter(self.base)

        def pull(_index: int) -> Tuple[int, Any, Any]:  # the stream, not the index, says which sample
            try:
                return next(source)
            except StopIteration:
                raise StreamEnd from None

        while True:
            try:
                yield self.timed_item(UNKNOWN_INDEX, pull)
            except StreamEnd:
                return
