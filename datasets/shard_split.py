"""What every sharded format shares: each sample's index in the epoch, the bad-input policy, the
format libraries, the check of the folder, column and field names a dataset is given, and the check
that a file is a regular one before it is read. How shards split
across ranks and workers, and the lines that say what a split costs, are the model's
(pipebench/model/shards.py), which the report reads as well.

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
import json
import os
import stat
from bisect import bisect_right
from itertools import accumulate
from types import ModuleType
from typing import Any, Callable, List, Sequence, Tuple, Union

from pipebench.base.errors import DatasetError
from pipebench.base.extras import MissingExtra, installed, missing_line
from pipebench.storage.object_store import access_denied, is_url, read_failure, url_fs

__all__ = ["FORMATS_EXTRA", "ON_BAD_SAMPLE", "ShardFiles", "ShardOffsets", "bad_input", "check_policy",
           "name_list", "not_regular", "read_index", "require_library", "require_names"]

# The extra that installs every format's own library (webdataset, pyarrow).
FORMATS_EXTRA = "formats"
# dataset.on_bad_sample: fail stops before the job with one line naming the file and key; skip leaves the
# shard, file or sample out, counts it in the dataset's identity and says so in one line a job.
FAIL, SKIP = "fail", "skip"
ON_BAD_SAMPLE = (FAIL, SKIP)
# A bad-input line names this many of the places left out; the count covers all of them.
NAMED_PLACES = 3

# What a file that is no regular one is, by its stat mode, for the line that names it.
NOT_REGULAR_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                     (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
# A local file named as a URL.
FILE_SCHEME = "file://"
INDEX_FILE = "index.json"
# An index larger than this is no index: 256 MiB holds about half a million MDS shards' entries (a
# million LitData chunks' names), while a FIFO or a device named index.json would be read for ever.
MAX_INDEX_BYTES = 256 << 20


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


def read_index(reader: str, input_dir: str, kind: str, missing: str, check: Callable[[Any], Any]) -> Any:
    """`input_dir`'s index.json as `check` returns its JSON, read with a bounded read from a regular file;
    one line naming it where there is none (`missing`: the set it would make), the storage refuses it, or
    it is not `kind` (too large, or `check` raising ValueError or TypeError)."""
    fs, root = url_fs(input_dir)
    path, where = f"{root.rstrip('/')}/{INDEX_FILE}", f"{input_dir}/{INDEX_FILE}"
    odd = not_regular(where)  # as given, so a URL is not looked for on the local disk
    if odd:
        raise DatasetError(f"{reader}: {where}: {odd}")
    try:
        with fs.open(path, "rb") as f:
            if (getattr(f, "size", None) or 0) > MAX_INDEX_BYTES:  # an object store's size: refused unread
                raise ValueError(f"over {MAX_INDEX_BYTES >> 20} MiB")
            text = f.read(MAX_INDEX_BYTES + 1)
        if len(text) > MAX_INDEX_BYTES:
            raise ValueError(f"over {MAX_INDEX_BYTES >> 20} MiB")
        return check(json.loads(text))
    except FileNotFoundError:
        raise DatasetError(f"{reader}: {input_dir}: no {INDEX_FILE}, so {missing}") from None
    except PermissionError as exc:
        raise access_denied(reader, where, exc, input_dir) from None
    except (OSError, ValueError, TypeError) as exc:
        raise DatasetError(f"{reader}: {where}: not {kind} ({exc})") from None
    except Exception as exc:
        raise read_failure(input_dir, exc, where) from None


def require_library(module: str, feature: str) -> ModuleType:
    """The format's library, imported; a DatasetError with the one pip line (pipebench/base/extras.py)
    when it is not installed."""
    if not installed(module):
        raise DatasetError(missing_line([MissingExtra(feature, module.split(".")[0], FORMATS_EXTRA)]))
    return importlib.import_module(module)


def require_names(dataset: str, noun: str, **keys: object) -> None:
    """One line naming the key unless each of `keys` is a non-empty string (`noun`: what it names); any
    key but the first may also be None (a label key of null: no labels read)."""
    for position, (key, value) in enumerate(keys.items()):
        if not (isinstance(value, str) and value) and not (position and value is None):
            raise DatasetError(f"{dataset}: {key} must be {noun}, got {value!r}")


def name_list(dataset: str, noun: str, key: str, value: Union[str, Sequence[str]]) -> List[str]:
    """`value` as a list: one non-empty string, or a non-empty list of them (`noun`: what each names);
    else one line naming the key."""
    items = [value] if isinstance(value, str) else list(value)
    if not items or not all(isinstance(item, str) and item for item in items):
        raise DatasetError(f"{dataset}: {key} must be {noun}, or a list of them, got {value!r}")
    return items


def check_policy(dataset: str, value: object) -> str:
    """`value` if it is a dataset.on_bad_sample policy, else one line naming the key."""
    if value not in ON_BAD_SAMPLE:
        raise DatasetError(f"{dataset}: on_bad_sample must be one of {', '.join(ON_BAD_SAMPLE)}, got {value!r}")
    return str(value)


def bad_input(dataset: str, problems: Sequence[str], policy: str, kept: int, nothing: str) -> str:
    """Under on_bad_sample=fail, a DatasetError naming the first problem (file and key); under skip, one
    line for what is left out, naming the first few ('' for none). With no shard or file `kept`, a
    DatasetError saying `nothing` (`no samples in <folder>`) and naming the first problem."""
    if problems and policy != SKIP:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise DatasetError(f"{dataset}: {problems[0]}{more}; dataset.on_bad_sample=skip leaves it out")
    if not kept:
        raise DatasetError(f"{dataset}: {nothing}" + (f" ({problems[0]})" if problems else ""))
    if not problems:
        return ""
    more = f"; and {len(problems) - NAMED_PLACES} more" if len(problems) > NAMED_PLACES else ""
    return (f"{dataset}: on_bad_sample=skip left out {len(problems)} bad input(s): "
            f"{'; '.join(problems[:NAMED_PLACES])}{more}")


class ShardOffsets:
    """Where each shard's samples start in the epoch's index range: sample k of shard s is index
    offsets[s] + k, so every sample has one index whichever reader reads it."""

    def __init__(self, counts: Sequence[int]) -> None:
        self.counts = tuple(counts)
        self.starts = tuple(accumulate(self.counts, initial=0))[:-1]

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
    """What a job asks of a dataset read from shard files (`locations`, paths or URLs, their `sizes`, and
    the `offsets` of the shards' samples): its length, where a sample is, the files the page-cache warm-up
    reads, the line on what was left out, and a digest for its identity."""

    locations: Tuple[str, ...]
    sizes: Tuple[int, ...]
    offsets: ShardOffsets
    _note: str

    def __len__(self) -> int:
        return len(self.offsets)

    def shard_count(self) -> int:
        """How many shards the epoch is split into (pipebench/model/shards.py's idle_line)."""
        return len(self.offsets.counts)

    def describe(self, index: int) -> str:
        """The shard behind sample `index` and its place there."""
        return self.offsets.where(index, self.locations)

    def notes(self) -> Tuple[str, ...]:
        """The bad input on_bad_sample=skip left out, in one line; each job prints it."""
        return (self._note,) if self._note else ()

    def files(self) -> List[str]:
        """The files on local disk (the page-cache warm-up reads them); a URL's object has no pages here."""
        return [location for location in self.locations if not is_url(location)]

    def store_urls(self) -> List[str]:
        """The objects in a store: no local page cache holds them."""
        return [location for location in self.locations if is_url(location)]

    def content_digest(self) -> str:
        """A digest of each file's name and size: it changes when a shard is added, removed or rewritten."""
        digest = hashlib.sha256()
        for location, size in zip(self.locations, self.sizes):
            digest.update(f"{location}\t{size}\n".encode())
        return digest.hexdigest()
