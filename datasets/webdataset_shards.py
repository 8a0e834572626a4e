"""WebDataset tar shards (`dataset=webdataset`): the format most users train from at ImageNet scale.

`urls` takes webdataset's brace patterns (`shard-{000000..000127}.tar`), local paths, or URLs that
fsspec opens, one string or a list. Each sample is the members sharing a key (`key.jpg`, `key.cls`),
grouped with webdataset's own tar iterator; the extensions are the keys `image_ext` and `label_ext`.
Shards are split across ranks and DataLoader workers with webdataset's `split_by_node` and
`split_by_worker`, and `shuffle_buffer` samples are shuffled with its `shuffle` stage.

The chain gets the encoded image, opened lazily (datasets/lazy_image.py), so the decode stays a timed
step of its own. Shards are read through the job's FileReads (`open`), so the bytes, the cold cache
and the slow-storage what-if apply as they do to an image folder.

Building the dataset reads every shard's tar headers, not its images: the sample count, each
sample's index (datasets/shard_split.py) and the bad input, found before any job runs: a missing
shard, a truncated tar, a key with no image, a member larger than `max_member_mb`, a shard that is no
regular file. Each is one line naming the file and key, or, under `on_bad_sample=skip`, left out and
counted. A URL that cannot be read at all (no library for it, an endpoint that does not answer) is one
line naming it, whatever the policy (pipebench/storage/object_store.py).

A tar ends with an end-of-archive marker (zero blocks). Python's tarfile, and so webdataset, takes a
file that stops at a member's end, or inside the next header, for a whole archive: a shard cut there
would read as fewer samples with no word. So the scan looks for the marker after the last member and
calls a shard without one truncated. webdataset reads each member whole into memory, in each worker:
a member larger than the limit is refused before it can fill the host's memory.
"""

from __future__ import annotations

import io
import re
import tarfile
import time
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from torch.utils.data import IterableDataset

from pipebench.base.errors import DatasetError
from pipebench.storage.file_reads import BYTES_PER_MB, FileReads
from pipebench.storage.object_store import is_url, read_failure, url_fs

from .checks import require_int
from .lazy_image import rgb_from
from .sharded_plan import ShardedPlan
from .shard_split import (ShardFiles, ShardOffsets, bad_input, check_policy, name_list, not_regular,
                          require_library)

__all__ = ["WebDatasetShards", "expand_urls", "scan_shard", "write_shards"]

NAME = "webdataset"
FEATURE = "dataset=webdataset"
# The members webdataset's tar iterator leaves out (its `skip_meta` default): `__key__`-style names.
SKIP_META = re.compile(r"__[^/]*__($|/)")
# What `convert` names the shards: ShardWriter's %-pattern, so a brace pattern reads them back.
SHARD_PATTERN = "shard-%06d.tar"
# An image's extension in a shard: JPEG files are `key.jpg` whatever their file said, as webdataset's
# own examples and its decoders' first choice name them.
JPEG_SUFFIXES = (".jpg", ".jpeg")
# A tar block; the end-of-archive marker is blocks of zeros after the last member.
TAR_BLOCK = tarfile.BLOCKSIZE
# dataset.max_member_mb's default: webdataset reads a member whole into memory, in every worker, and a
# photo is KB to a few MB; 1 GiB is hundreds of the largest, yet far from the 10 GB member that got a job
# OOM-killed. The setting may go up to 64 GiB (MAX_MEMBER_MB), past what a host holds per worker.
DEFAULT_MAX_MEMBER_MB = 1024
MAX_MEMBER_MB = 65_536


def _wds() -> Any:
    return require_library("webdataset", FEATURE)


def expand_urls(urls: Union[str, Sequence[str]]) -> List[str]:
    """Every shard `urls` names: brace patterns expanded by webdataset, a list expanded item by item."""
    expand = _wds().shardlists.expand_urls
    items = name_list(NAME, "a path, URL or brace pattern", "urls", urls)
    return [url for item in items for url in expand(item)]


@dataclass(frozen=True)
class ShardScan:
    """One shard's headers read: its size, how many samples have an image, the keys that have none
    (neither counted in a shard with a problem), and what is wrong with the shard as a whole ('' when
    nothing is)."""

    url: str
    size: int
    samples: int
    no_image: Tuple[str, ...]
    problem: str


def _end_problem(raw: Any, end: int, size: int, last: str) -> str:
    """'' when an end-of-archive block (zeros) follows the last member at byte `end`, else why not."""
    raw.seek(end)
    block = raw.read(TAR_BLOCK)
    if len(block) < TAR_BLOCK:
        cut = "just after it" if end == size else f"{size - end} bytes into the next header"
        return f"truncated tar: no end-of-archive marker: it ends after {last}, cut {cut} (at byte {size})"
    if block.count(0) != TAR_BLOCK:
        return f"not a readable tar after {last}: the header at byte {end} is damaged"
    return ""


def scan_shard(url: str, image_exts: Sequence[str], max_member_bytes: int = DEFAULT_MAX_MEMBER_MB * BYTES_PER_MB
               ) -> ShardScan:
    """Read one shard's tar headers (member data is skipped by seeking), grouping members by key as
    webdataset's `group_by_keys` does: consecutive members whose names share the part before the first
    dot of the base name. The shard must be a regular file, end with its end-of-archive marker and hold
    no member over `max_member_bytes`."""
    key_of = _wds().tariterators.base_plus_ext
    fs, path = url_fs(url)
    odd = not_regular(url)
    if odd:
        return ShardScan(url, 0, 0, (), odd)
    try:
        size = fs.size(path)
    except FileNotFoundError:
        return ShardScan(url, 0, 0, (), "no such shard")
    except Exception as exc:
        if is_url(url) or not isinstance(exc, OSError):
            raise read_failure(url, exc) from None
        return ShardScan(url, 0, 0, (), f"cannot open it: {exc}")
    members, last = [], "its first member"  # (key, extension) of each member of a sample, in order
    try:
        with fs.open(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r:") as tar:
            for member in tar:
                if member.offset_data + member.size > size:
                    return ShardScan(url, size, 0, (), f"truncated tar: member {member.name} ends at byte "
                                     f"{member.offset_data + member.size}, past the file's {size}")
                if member.size > max_member_bytes:
                    return ShardScan(url, size, 0, (), f"member {member.name} holds {member.size} bytes, "
                                     f"over the {max_member_bytes / BYTES_PER_MB:g} MiB dataset.max_member_mb "
                                     "allows (webdataset reads a member whole into memory)")
                last = f"member {member.name}"
                if not member.isreg() or SKIP_META.match(member.name):
                    continue
                prefix, suffix = key_of(member.name)
                if prefix is not None:
                    members.append((prefix, suffix.lower()))
            end = _end_problem(raw, tar.offset, size, last)
        if end:
            return ShardScan(url, size, 0, (), end)
    except tarfile.TarError as exc:
        what = f"truncated tar: it ends after {last}" if "end of" in str(exc) else f"not a readable tar at {last}"
        return ShardScan(url, size, 0, (), f"{what} ({exc})")
    except Exception as exc:
        if is_url(url) or not isinstance(exc, OSError):
            raise read_failure(url, exc) from None
        return ShardScan(url, size, 0, (), f"cannot read it: {exc}")
    samples = [(key, {ext for _, ext in group}) for key, group in groupby(members, key=itemgetter(0))]
    no_image = tuple(key for key, exts in samples if not exts.intersection(image_exts))
    return ShardScan(url, size, len(samples) - len(no_image), no_image, "")


def _extensions(value: Union[str, Sequence[str]], key: str) -> Tuple[str, ...]:
    return tuple(item.lower().lstrip(".") for item in name_list(NAME, "an extension such as jpg", key, value))


class WebDatasetShards(ShardFiles, ShardedPlan, IterableDataset):
    """Yields `(index, image, label)` for this reader's shards: the image undecoded, the label the
    integer in `key.<label_ext>` (0 for every sample when `label_ext` is null)."""

    def __init__(self, urls: Union[str, Sequence[str]], image_ext: Union[str, Sequence[str]] = "jpg",
                 label_ext: Optional[str] = "cls", shuffle_buffer: int = 0, seed: int = 0,
                 on_bad_sample: str = "fail", max_member_mb: int = DEFAULT_MAX_MEMBER_MB):
        self.pattern = urls
        self.image_exts = _extensions(image_ext, "image_ext")
        self.label_ext = None if label_ext is None else _extensions(label_ext, "label_ext")[0]
        self.shuffle_buffer = require_int(NAME, "shuffle_buffer", shuffle_buffer, 0)
        self.seed = require_int(NAME, "seed", seed, 0)
        self.on_bad_sample = check_policy(NAME, on_bad_sample)
        self.max_member_mb = require_int(NAME, "max_member_mb", max_member_mb, 1, MAX_MEMBER_MB)
        scans = [scan_shard(url, self.image_exts, self.max_member_mb * BYTES_PER_MB) for url in expand_urls(urls)]
        problems = [f"{s.url}: {s.problem}" for s in scans if s.problem]
        problems += [f"{s.url}: key {key} has no image (no .{' or .'.join(self.image_exts)} member)"
                     for s in scans if not s.problem for key in s.no_image]
        kept = [s for s in scans if not s.problem and s.samples]
        self._note = bad_input(NAME, problems, self.on_bad_sample, len(kept), f"no samples in {urls!r}")
        self.urls = self.locations = tuple(s.url for s in kept)
        self.sizes = tuple(s.size for s in kept)
        self.offsets = ShardOffsets([s.samples for s in kept])
        self.skipped = {k: v for k, v in (("shards", sum(1 for s in scans if s.problem)),
                                          ("samples", sum(len(s.no_image) for s in scans if not s.problem))) if v}
        self.reads = FileReads()

    def _opened(self, urls: Iterable[str]) -> Iterator[Dict[str, Any]]:
        """webdataset's url_opener, reading through this process's FileReads; each shard is closed when
        the next one is asked for."""
        for url in urls:
            with self.reads.open(url) as stream:
                yield {"url": url, "stream": stream}

    def _indexed(self, samples: Iterable[Dict[str, Any]]) -> Iterator[Tuple[int, bytes, Any, str]]:
        """(index, image bytes, label member, where) for each sample with an image; a key without one was
        left out when the shards were scanned (on_bad_sample=skip) and is passed over here alike."""
        shard_of = {url: k for k, url in enumerate(self.urls)}
        seen: Dict[str, int] = {}
        for sample in samples:
            image = next((sample[ext] for ext in self.image_exts if ext in sample), None)
            if image is None:
                continue
            url = sample["__url__"]
            position = seen.get(url, 0)
            seen[url] = position + 1
            label = sample.get(self.label_ext) if self.label_ext else None
            yield self.offsets.index(shard_of[url], position), image, label, f"{url}: key {sample['__key__']}"

    def __iter__(self) -> Iterator[Tuple[int, Any, int]]:
        wds = _wds()
        urls = wds.split_by_worker(wds.split_by_node(self.urls))
        members = wds.tariterators.tar_file_expander(self._opened(urls))
        samples: Iterator = self._indexed(wds.tariterators.group_by_keys(members))
        if self.shuffle_buffer > 1:
            samples = wds.shuffle(self.shuffle_buffer, initial=self.shuffle_buffer, seed=self.seed)(samples)
        for index, image, label, where in samples:
            yield index, rgb_from(io.BytesIO(image)), self._label(label, where)

    def _label(self, member: Optional[bytes], where: str) -> int:
        if self.label_ext is None:
            return 0
        try:
            return int(member)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise DatasetError(f"{NAME}: {where}: .{self.label_ext} holds {member!r}, not an integer label "
                               "(dataset.label_ext=null reads no labels)") from None

    def identity(self) -> dict:
        """The pattern, the shard and sample counts (each shard's too), and a digest of each shard's name and size."""
        return {
            "name": NAME,
            "urls": self.pattern if isinstance(self.pattern, str) else list(self.pattern),
            "shards": len(self.urls),
            # Each shard's samples: how unevenly the shards load the readers (pipebench.model.shards.uneven_line).
            "shard_samples": list(self.offsets.counts),
            "num_samples": len(self),
            "image_ext": list(self.image_exts),
            "label_ext": self.label_ext,
            "shuffle_buffer": self.shuffle_buffer,
            "seed": self.seed,
            "content_digest": self.content_digest(),
            **({"skipped": self.skipped} if self.skipped else {}),
        }


def _image_ext(path: str) -> str:
    suffix = Path(path).suffix.lower()
    return "jpg" if suffix in JPEG_SUFFIXES else suffix.lstrip(".")


def write_shards(samples: Iterable[Tuple[str, bytes, int]], out: Path, shard_size: int,
                 progress: Callable[[int], None] = lambda done: None) -> List[str]:
    """Write `(source path, encoded image, label)` samples as `key.<ext>` + `key.cls` into shards of
    `shard_size` samples under `out`, with webdataset's ShardWriter; returns the shards written.

    Every member's mtime is the write's start in whole seconds: ShardWriter's default, a float
    `time.time()`, does not fit a ustar header, so tarfile writes a PAX header before each member,
    which every reader then parses in Python (docs/formats.md, "Side by side")."""
    wds = _wds()
    written: List[str] = []
    with wds.ShardWriter(str(out / SHARD_PATTERN), maxcount=shard_size, verbose=0, post=written.append,
                         mtime=int(time.time())) as sink:
        for number, (path, data, label) in enumerate(samples):
            sink.write({"__key__": f"{number:08d}", _image_ext(path): data, "cls": str(label).encode()})
            progress(number + 1)
    return written
