"""What splitting an epoch's shards among readers costs, and the lines that say so: the arithmetic the
plan-time checks (each dataset's `plan_warnings`) and the report's what-to-do list share.

A stream-style format splits its shards among ranks and workers as webdataset's `split_by_node` and
`split_by_worker` do (`split`). With fewer shards than ranks x workers some workers read nothing the
whole epoch while the rest carry it (`idle_line`). Shards of unequal size, or a count that does not
split evenly, leave readers unequal loads: reading at about one rate each, the epoch lasts as long as
the busiest takes, which reads alone once the next busiest is done (`uneven_line`).

pyarrow reads a Parquet file a row group at a time, and a map-style reader keeps its last
ROW_GROUPS_KEPT: under a shuffling sampler a sample lands in a row group not kept about 1 - kept/groups
of the time, and that row group is read whole for the one sample (datasets#5669, #7508;
`random_access_line`).
"""
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple, TypeVar

from pipebench.base.typed_json import parse

__all__ = ["LONE_TAIL_WORTH_NAMING", "ROW_GROUPS_KEPT", "ROW_GROUP_ROWS", "RowGroupFacts", "UnevenShards", "idle_line",
           "idle_readers", "random_access_line", "reader_loads", "split", "uneven_line", "uneven_shards"]

# A lone tail (one reader still reading while the others wait) worth a line, as a share of the epoch:
# below a tenth it hides within a run's noise (shared 2-core machines wobble by up to ~15% between runs).
LONE_TAIL_WORTH_NAMING = 0.10

T = TypeVar("T")


def split(shards: Sequence[T], rank: int, world: int, worker: int, workers: int) -> List[T]:
    """The shards one reader takes: every world-th from its rank, then every workers-th of those from
    its worker, as webdataset's split_by_node and split_by_worker do."""
    return list(shards[rank::world][worker::max(workers, 1)])


def idle_readers(shards: int, world: int, workers: int) -> List[Tuple[int, int]]:
    """(rank, worker) of every reader that gets no shard; `workers=0` reads in each rank's own process."""
    return [reader for reader, samples in reader_loads([1] * shards, world, workers) if not samples]


def reader_loads(counts: Sequence[int], world: int, workers: int) -> List[Tuple[Tuple[int, int], int]]:
    """((rank, worker), samples) of every reader, from each shard's sample count, split as `split` does;
    `workers=0` reads in each rank's own process."""
    readers = max(workers, 1)
    return [((rank, worker), sum(split(counts, rank, world, worker, readers)))
            for rank in range(world) for worker in range(readers)]


@dataclass(frozen=True)
class UnevenShards:
    """How unevenly an epoch's shards load its readers: the largest shard's share of the epoch's samples,
    the busiest reader and its samples, the next busiest's, the share of the epoch the busiest reads
    alone (each reader reading at one rate), and the epoch's time over an even split's."""

    total: int
    largest_share: float
    busiest: Tuple[int, int]
    busiest_samples: int
    next_samples: int
    busy_readers: int
    lone_share: float
    slowdown: float


def uneven_shards(counts: Sequence[int], world: int, workers: int) -> Optional[UnevenShards]:
    """The unevenness of splitting shards of `counts` samples over world x workers readers; None when
    fewer than two readers get a shard (one reader has no one to wait for; `idle_line` names the idle)."""
    loads = [(reader, samples) for reader, samples in reader_loads(counts, world, workers) if samples]
    if len(loads) < 2:
        return None
    ranked = sorted(loads, key=lambda load: -load[1])
    (busiest, most), (_, next_most) = ranked[0], ranked[1]
    total = sum(samples for _, samples in loads)
    return UnevenShards(total, max(counts) / total, busiest, most, next_most, len(loads),
                        (most - next_most) / most, most / (total / len(loads)))


def uneven_line(dataset: str, counts: Sequence[int], world: int, workers: int) -> str:
    """One line when the busiest reader reads alone for LONE_TAIL_WORTH_NAMING of the epoch or more
    ('' otherwise): the largest shard's share, the loads, the lone tail, the epoch's lengthening and
    what to do."""
    uneven = uneven_shards(counts, world, workers)
    if uneven is None or uneven.lone_share < LONE_TAIL_WORTH_NAMING:
        return ""
    rank, worker = uneven.busiest
    others = "the other one waits" if uneven.busy_readers == 2 else f"the other {uneven.busy_readers - 1} wait"
    who = f"rank {rank}" if workers == 0 else f"worker {worker}" if world == 1 else f"rank {rank} worker {worker}"
    return (f"{dataset}: uneven shards: the largest of {len(counts)} holds {100 * uneven.largest_share:.0f}% of the "
            f"epoch's {uneven.total} samples, and at {_layout(world, workers)} {who} reads {uneven.busiest_samples} "
            f"against {uneven.next_samples} for the next busiest, so for the last {100 * uneven.lone_share:.0f}% of "
            f"the epoch it reads alone while {others}, and the epoch takes {uneven.slowdown:.2f}x an even split's "
            f"time; write shards of one size, a multiple of {world * max(workers, 1)} of them (`pipebench dataset "
            "convert --shard-size N` fills all but the last)")


def _layout(world: int, workers: int) -> str:
    return (f"{world} ranks x {workers} workers" if world > 1 and workers else
            f"{world} ranks" if world > 1 else f"{workers} workers")


def _named(idle: Sequence[Tuple[int, int]], world: int, workers: int) -> str:
    if workers == 0:
        return "ranks " + ", ".join(str(rank) for rank, _ in idle)
    if world == 1:
        return "workers " + ", ".join(str(worker) for _, worker in idle)
    by_rank: dict = {}
    for rank, worker in idle:
        by_rank.setdefault(rank, []).append(str(worker))
    return "; ".join(f"rank {rank} workers {', '.join(ws)}" for rank, ws in by_rank.items())


def idle_line(dataset: str, shards: int, world: int, workers: int) -> str:
    """One line when fewer shards than ranks x workers leave readers with none ('' otherwise): the
    shard count, the workers (or ranks, at workers=0) that read nothing, and what to do."""
    idle = idle_readers(shards, world, workers)
    if not idle:
        return ""
    readers = world * max(workers, 1)
    layout = _layout(world, workers)
    fewer = f"distributed.nproc={shards}" if shards < world else f"workers={shards // world}"
    return (f"{dataset}: {shards} shard(s) for {readers} readers ({layout}): {_named(idle, world, workers)} get no "
            f"shard and read nothing this epoch, so {readers - len(idle)} carry it; write more, smaller shards "
            f"(`pipebench dataset convert --shard-size N`, at least {readers}) or use {fewer}")


# Row groups a map-style reader keeps decoded (a few MiB each at HF's 100 image rows): enough that
# reading in order reads each once, few enough that 8 workers x 2 stay small beside their images.
ROW_GROUPS_KEPT = 2
# The rows of a row group `convert --to parquet` writes: HF `datasets` writes image sets in row groups
# of 100 rows (its config.DEFAULT_MAX_BATCH_SIZE for image features).
ROW_GROUP_ROWS = 100
BYTES_PER_KB, BYTES_PER_MB = 1e3, 1e6


def _size(count: float) -> str:
    return f"{count / BYTES_PER_MB:.1f} MB" if count >= BYTES_PER_MB else f"{count / BYTES_PER_KB:.0f} KB"


@dataclass(frozen=True)
class RowGroupFacts:
    """What a dataset's identity says of its row groups (a map-style Parquet set's), read once."""

    name: str = "dataset"
    row_groups: Optional[int] = None
    num_samples: Optional[int] = None
    file_bytes: Optional[int] = None
    streaming: bool = False


def random_access_line(identity: Mapping[str, Any], shuffle: bool,
                       read_bytes_per_sample: Optional[float] = None) -> str:
    """One line when a map-style row-group dataset (its identity's `row_groups`) is read under a
    shuffling sampler and its row groups hold more than one row and outnumber those kept ('' otherwise):
    the share of samples that read a whole row group, what that reads (measured bytes a sample against
    a row's average size when given, else the rows and their bytes), why, and what to do."""
    facts = parse(RowGroupFacts, identity)
    groups, samples = int(facts.row_groups or 0), int(facts.num_samples or 0)
    if not shuffle or facts.streaming or groups <= ROW_GROUPS_KEPT or samples <= groups:
        return ""
    rows = samples / groups
    row_bytes = facts.file_bytes / samples if facts.file_bytes else None
    if read_bytes_per_sample and row_bytes:
        reads = (f"measured: {_size(read_bytes_per_sample)} read a sample against {_size(row_bytes)} a row "
                 f"({read_bytes_per_sample / row_bytes:.0f}x)")
    else:
        reads = f"{rows:.0f} rows read for one" + (f" (about {_size(rows * row_bytes)})" if row_bytes else "")
    return (f"{facts.name}: shuffled random access reads whole row groups: {samples} samples "
            f"in {groups} row groups of {rows:.0f} rows on average, and a reader keeps its last {ROW_GROUPS_KEPT}, "
            f"so about {100 * (1 - ROW_GROUPS_KEPT / groups):.0f}% of samples (loader.shuffle=true) land in one not "
            f"kept and read it whole, {reads}; dataset.streaming=true reads each row group once, split across "
            "workers, or write row groups of fewer rows (`pipebench dataset convert --to parquet --shard-size N`: "
            f"N rows a file, one row group below {ROW_GROUP_ROWS}), or use loader.shuffle=false where order does "
            "not matter")
