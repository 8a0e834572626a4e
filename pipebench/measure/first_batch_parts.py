"""A job's time to first batch, taken apart: opening the files, what the reader reads before its first
sample comes out, the first decode.

A sharded set can wait long before its first batch (webdataset#267): every worker opens its first
shard, a shuffle buffer fills, the decoder pays its set-up. The first batch carries each sample's
timings and reads like every batch, so its parts are read from it:

- `first_batch_open_s`: the time in opens while the batch was made (shards, files, a URL's size);
- `first_batch_fill_s`: the first sample's load step, its opens left out: what the reader read
  before its first sample came out (a whole shuffle buffer, a Parquet row group, one image file);
- `first_batch_decode_s`: the first sample's decode step, the decoder's set-up included.

Each is the median over repeats, as `first_batch_s` is; empty where nothing was opened or decoded
through pipebench, and in a rank merge.
"""

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from pipebench.storage.file_reads import OPEN_NS
from pipebench.pipeline.timed_chain import TimedBatch

__all__ = ["FIRST_BATCH_PART_COLUMNS", "FirstBatchLog", "FirstBatchParts", "first_batch_columns", "parts_of"]

FIRST_BATCH_PART_COLUMNS = ("first_batch_open_s", "first_batch_fill_s", "first_batch_decode_s")
NS_PER_S = 1e9
# A sample's timings, in InstrumentedDataset.steps' order: the load, then the decode.
LOAD_STEP, DECODE_STEP = 0, 1


@dataclass(frozen=True)
class FirstBatchParts:
    """One repeat's first batch taken apart, in seconds (see the module doc); None: not measured."""

    open_s: Optional[float]
    fill_s: float
    decode_s: Optional[float]


def parts_of(batch: TimedBatch) -> FirstBatchParts:
    """The parts of `batch`, the first a repeat delivered."""
    opened_ns = batch.sample_io[:, OPEN_NS]
    read_any = bool(batch.sample_io.any())
    decode_ns = int(batch.sample_ns[0, DECODE_STEP])
    return FirstBatchParts(open_s=float(opened_ns.sum()) / NS_PER_S if read_any else None,
                           fill_s=float(batch.sample_ns[0, LOAD_STEP] - opened_ns[0]) / NS_PER_S,
                           decode_s=decode_ns / NS_PER_S if decode_ns else None)


class FirstBatchLog:
    """A step loop's `on_batch` hook: passes every batch on to `then` and keeps the parts of the first
    one that holds samples (`parts`; None until it comes)."""

    def __init__(self, then: Callable[[TimedBatch, int], None]) -> None:
        self.then = then
        self.parts: Optional[FirstBatchParts] = None

    def __call__(self, batch: TimedBatch, epoch: int) -> None:
        if self.parts is None and batch.sample_ns.shape[0]:
            self.parts = parts_of(batch)
        self.then(batch, epoch)


def first_batch_columns(parts: Sequence[Optional[FirstBatchParts]]) -> Dict[str, Optional[float]]:
    """The summary cells: each part's median over the repeats that measured it (None where none did)."""

    def median(values: Sequence[Optional[float]]) -> Optional[float]:
        measured = [value for value in values if value is not None]
        return float(np.median(measured)) if measured else None

    kept = [p for p in parts if p is not None]
    return dict(zip(FIRST_BATCH_PART_COLUMNS, (median([p.open_s for p in kept]), median([p.fill_s for p in kept]),
                                               median([p.decode_s for p in kept]))))
