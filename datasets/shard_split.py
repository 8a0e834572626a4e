"""What every sharded format shares: shards split across ranks and workers, each sample's index in the
epoch, the bad-input policy, the line for the workers that get no shard, and the check that a file is
a regular one before it is read.

A stream-style format decides for itself which samples a process reads: rank `r` of `world` takes
shards r, r + world, ... of the list, and worker `w` of `W` every W-th of those, as webdataset's
`split_by_node` and `split_by_worker` do (`split`). With fewer shards than ranks x workers some
workers get none and read nothing the whole epoch, while the rest carry it: `idle_line` names them,
at plan time (pipebench/cli/run.py) and in the report (pipebench/report/diagnosis.py), which reads
the shard count from the dataset's identity. Nothing here imports torch, so the report can use it.

Shards of unequal size, or a count that does not split evenly, leave readers with unequal loads even
when none is idle. Each reader reads its own samples at about one rate, so the epoch lasts as long as
the busiest takes, and once the next busiest is done the busiest reads alone while the rest wait:
`uneven_shards` gives the largest shard's share of the epoch, each reader's load (`reader_loads`),
that lone tail's share of the epoch and how much longer the epoch takes than an even split would;
`uneven_line` says it when the tail is worth naming, from the per-shard sample counts the dataset's
identity keeps (`shard_samples`).

A sample's index is its shard's offset plus its place among that shard's samples (`ShardOffsets`), so
the exactly-once check (pipebench/measure/coverage.py) sees which sample each process read however
the shards were split or shuffled.

A shard, a Parquet file or an index must be a regular file (or a link to one) before it is opened:
opening a FIFO waits for a writer that may never come, and a device such as `/dev/zero` never ends
(`not_regular`, the image folder's rule, datasets/folder_walk.py).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import stat
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate
from types import ModuleType
from typing import List, Optional, Sequence, Tuple, TypeVar

from pipebench.base.errors import DatasetError
from pipebench.base.extras import MissingExtra, installed, missing_line
from pipebench.storage.object_store import is_url

__all__ = ["FORMATS_EXTRA", "LONE_TAIL_WORTH_NAMING", "ON_BAD_SAMPLE", "ShardFiles", "ShardOffsets", "UnevenShards",
           "bad_input", "check_policy", "idle_line", "idle_readers", "not_regular", "reader_loads", "require_library",
           "split", "uneven_line", "uneven_shards"]

# The extra that installs every format's own library (webdataset, pyarrow).
FORMATS_EXTRA = "formats"
# dataset.on_bad_sample: fail stops before the job with one line naming the file and key; skip leaves the
# shard, file or sample out, counts it in the dataset's identity and says so in one line a job.
FAIL, SKIP = "fail", "skip"
ON_BAD_SAMPLE = (FAIL, SKIP)
# A bad-input line names this many of the places left out; the count covers all of them.
NAMED_PLACES = 3
# A lone tail (one reader still reading while the others wait) worth a line, as a share of the epoch:
# below a tenth it hides within a run's noise (shared 2-core machines wobble by up to ~15% between runs).
LONE_TAIL_WORTH_NAMING = 0.10

# What a file that is no regular one is, by its stat mode, for the line that names it.
NOT_REGULAR_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                     (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
# A local file named as a URL.
FILE_SCHEME = "file://"

T = TypeVar("T")


def not_regular(location: str) -> str:
    """Why the local file at `location` is not read, for a line naming it: '' for a regular file or a
    link to one, for a URL (an object store has no FIFOs) and for a path that does not exist (the
    caller's own 'no such file' line); else what it is, e.g. `not a regular file but a character device
    (a link to /dev/zero): not read`."""
    path = location[len(FILE_SCHEME):] if location.startswith(FILE_SCHEME) else location
    if is_url(path):
        return ""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"cannot look at it ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return ""
    kind = next((name for test, name in NOT_REGULAR_KINDS if test(mode)), "no regular file")
    link = f" (a link to {os.readlink(path)})" if os.path.islink(path) else ""
    return f"not a regular file but {kind}{link}: not read (reading one may never end)"


def require_library(module: str, feature: str) -> ModuleType:
    """The format's library, imported; a DatasetError with the one pip line (pipebench/base/extras.py)
    when it is not installed."""
    if not installed(module):
        raise DatasetError(missing_line([MissingExtra(feature, module.split(".")[0], FORMATS_EXTRA)]))
    return importlib.import_module(module)


def check_policy(dataset: str, value: object) -> str:
    """`value` if it is a dataset.on_bad_sample policy, else one line naming the key."""
    if value not in ON_BAD_SAMPLE:
        raise DatasetError(f"{dataset}: on_bad_sample must be one of {', '.join(ON_BAD_SAMPLE)}, got {value!r}")
    return str(value)


def bad_input(dataset: str, problems: Sequence[str], policy: str) -> str:
    """Under on_bad_sample=fail, a DatasetError naming the first problem (file and key); under skip, one
    line for what is left out, naming the first few ('' for none)."""
    if problems and policy != SKIP:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DatasetError(f"{dataset}: {problems[0]}{more}; dataset.on_bad_sample=skip leaves it out")
    if not problems:
        return ""
    more = f"; and {len(problems) - NAMED_PLACES} more" if len(problems) > NAMED_PLACES else ""
    return (f"{dataset}: on_bad_sample=skip left out {len(problems)} bad input(s): "
            f"{'; '.join(problems[:NAMED_PLACES])}{more}")


def split(shards: Sequence[T], rank: int, world: int, worker: int, workers: int) -> List[T]:
    """The shards one reader takes: every world-th from its rank, then every workers-th of those from
    its worker, as webdataset's split_by_node and split_by_worker do."""
    return list(shards[rank::world][worker::max(workers, 1)])


def idle_readers(shards: int, world: int, workers: int) -> List[Tuple[int, int]]:
    """(rank, worker) of every reader that gets no shard; `workers=0` reads in each rank's own process."""
    readers = max(workers, 1)
    return [(rank, worker) for rank in range(world) for worker in range(readers)
            if not split(range(shards), rank, world, worker, readers)]


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


class ShardOffsets:
    """Where each shard's samples start in the epoch's index range: sample k of shard s is index
    offsets[s] + k, so every sample has one index whichever reader reads it."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.counts = tuple(counts)
        self.starts = (0, *accumulate(self.counts))[:-1] if self.counts else ()

    def __len__(self) -> int:
        return sum(self.counts)

    def index(self, shard: int, position: int) -> int:
        return self.starts[shard] + position

    def locate(self, index: int) -> Tuple[int, int]:
        """(shard, position in it) of sample `index`; IndexError outside the epoch."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        shard = bisect_right(self.starts, index) - 1
        return shard, index - self.starts[shard]

    def where(self, index: int, locations: Sequence[str]) -> str:
        """The shard of `locations` behind sample `index` and its place there, for a line naming it."""
        try:
            shard, position = self.locate(index)
        except IndexError:
            return f"sample {index}"
        return f"{locations[shard]}, sample {position} of it"


class ShardFiles:
    """What a job asks of a dataset read from shard files (`locations`, paths or URLs, and their `sizes`):
    the files the page-cache warm-up reads, the line on what was left out, and a digest for its identity."""

    locations: Tuple[str, ...]
    sizes: Tuple[int, ...]
    _note: str

    def notes(self) -> Tuple[str, ...]:
        """The bad input on_bad_sample=skip left out, in one line; each job prints it."""
        return (self._note,) if self._note else ()

    def files(self) -> List[str]:
        """The files on local disk (the page-cache warm-up reads them); a URL's object has no pages here."""
        return [location for location in self.locations if not is_url(location)]

    def content_digest(self) -> str:
        """A digest of each file's name and size: it changes when a shard is added, removed or rewritten."""
        digest = hashlib.sha256()
        for location, size in zip(self.locations, self.sizes):
            digest.update(f"{location}\t{size}\n".encode())
        return digest.hexdigest()
