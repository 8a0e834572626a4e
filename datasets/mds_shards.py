"""Mosaic's MDS shards (`dataset=mds`), read by a reader written to the published format.

MDS is the one format not read through its own library: mosaicml-streaming pins numpy<2.2 (its 0.10.0
and older declare no bound), and LitData's MDS reading fails on uncompressed shards and ndarray columns
(docs/formats.md). What is read is what streaming's `MDSWriter` writes (format version 2), checked on
golden shards it wrote (tests/fixtures/mds/):

- `index.json`: `{"version": 2, "shards": [...]}`, one entry a shard: its `samples`, its columns
  (`column_names`, sorted; `column_encodings`; `column_sizes`, a fixed size in bytes or null for a
  variable one), its `compression` (null, `zstd` or `gz`, with an optional `:level`), `raw_data` (the
  shard as written: `basename`, `bytes`) and `zip_data` (the file stored when compressed, else null);
- a shard as written: a uint32 sample count, then sample count + 1 uint32 offsets (where each sample
  starts in the shard, the last where the shard ends), the writer's config as JSON, then the samples;
  every integer little-endian. Compression is of the whole shard;
- a sample: a uint32 size for each variable-size column, in column order, then each column's bytes.

The chain gets the image column's encoded bytes (`jpeg`, `png` or `bytes`), opened lazily
(datasets/lazy_image.py), so the decode stays a timed step of its own; a `pil` column stores raw
pixels, so its image reaches the chain decoded already, built in the dataset's load step. The label is
an integer column (`int`, `int8`...`uint64`, `str_int`). A sample's index is its shard's offset plus
its place in the shard (datasets/shard_split.py), and the shards are split across ranks and workers
as webdataset splits tar shards. Shards are read through the job's FileReads, so the read columns, the
cold cache and the slow-storage what-if apply.

Building the dataset reads `index.json` and each uncompressed shard's offsets table, not its samples:
a shard missing, of another size than the index says, with an offsets table that does not match it,
named outside the folder, with an unknown compression, or no regular file, is one line naming it, or,
under `on_bad_sample=skip`, left out and counted. Every read is bounded: the index by shard_split's
MAX_INDEX_BYTES, a compressed shard by the size the index gives for it as written.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from PIL import Image
from torch.utils.data import IterableDataset

from pipebench.base.errors import DatasetError
from pipebench.base.typed_json import parse
from pipebench.model.shards import split
from pipebench.storage.file_reads import FileReads
from pipebench.storage.object_store import is_url, read_failure, url_fs
from pipebench.storage.rank_info import reader_position

from .lazy_image import rgb_from
from .sharded_plan import ShardedPlan
from .shard_split import (INDEX_FILE, ShardFiles, ShardOffsets, bad_input, check_policy, not_regular,
                          read_index, require_library, require_names)

__all__ = ["MDSShards", "ShardEntry", "decode_int", "sample_columns"]

NAME = "mds"
FEATURE = "dataset=mds"
# The index format MDSWriter writes (streaming 0.4 to 0.13): its readers refuse any other version.
INDEX_VERSION = 2
# Compressions read (MDSWriter's names): none, zstd (the zstandard package, in the formats extra) and gz
# (stdlib zlib, gzip's framing). MDSWriter also writes br, bz2 and snappy: no golden shard tests them.
ZSTD, GZIP = "zstd", "gz"
COMPRESSIONS = (None, ZSTD, GZIP)
# zlib's window bits for a gzip stream (its header and trailer checked).
GZIP_WBITS = 16 + zlib.MAX_WBITS
# Image columns whose bytes are the encoded image (handed to the chain undecoded), and MDS's `pil`, raw
# pixels behind a width, a height and a mode (decoded already).
ENCODED_IMAGES = ("jpeg", "png", "bytes")
RAW_PIXELS = "pil"
# Integer label columns: fixed-size little-endian integers (unsigned when named so), and digits as text.
INT_LABELS = ("int", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
TEXT_INT = "str_int"
# Offsets in a shard are uint32, so a shard as written holds at most this many bytes.
MAX_RAW_BYTES = 1 << 32


def _encoding_name(encoding: str) -> str:
    """`jpeg` of `jpeg:95`: an encoding's name without its settings."""
    return encoding.split(":", 1)[0]


def sample_columns(data: bytes, sizes: Sequence[Optional[int]]) -> List[bytes]:
    """Each column's stored bytes in one sample, in column order: `sizes` gives each column's fixed size,
    None for a variable one, whose size leads the sample as a uint32. ValueError when they do not fill it."""
    variable = sum(size is None for size in sizes)
    head = 4 * variable
    if len(data) < head:
        raise ValueError(f"{len(data)} bytes, short of its {variable} column sizes")
    given = iter(struct.unpack_from(f"<{variable}I", data))
    columns, at = [], head
    for size in sizes:
        length = next(given) if size is None else size
        columns.append(data[at:at + length])
        at += length
    if at != len(data):
        raise ValueError(f"its columns fill {at} of its {len(data)} bytes")
    return columns


def decode_int(encoding: str, raw: bytes) -> int:
    """The integer an MDS integer column stores: little-endian (signed unless `uint*`), or digits."""
    name = _encoding_name(encoding)
    if name == TEXT_INT:
        return int(raw.decode("utf-8"))
    return int.from_bytes(raw, "little", signed=not name.startswith("uint"))


def _pil_image(raw: bytes) -> Image.Image:
    """MDS's `pil` column: uint32 width, height and mode length, the mode, then the raw pixels; in RGB."""
    width, height, mode_size = struct.unpack_from("<3I", raw)
    mode = raw[12:12 + mode_size].decode("utf-8")
    image = Image.frombytes(mode, (width, height), raw[12 + mode_size:])
    return image if image.mode == "RGB" else image.convert("RGB")


@dataclass(frozen=True)
class ShardEntry:
    """One shard as index.json lists it: where it is, what is stored and what was written."""

    location: str
    samples: int
    columns: Tuple[str, ...]
    encodings: Tuple[str, ...]
    sizes: Tuple[Optional[int], ...]
    compression: Optional[str]
    raw_bytes: int
    stored_bytes: int

    @property
    def header_bytes(self) -> int:
        """The sample count and the offsets table."""
        return 4 * (self.samples + 2)


@dataclass(frozen=True)
class _ShardFile:
    """`raw_data` or `zip_data` in a shard's index.json object: a file of the shard and its size."""

    basename: str
    bytes: int


@dataclass(frozen=True)
class _ListedShard:
    """A shard's object in index.json, as MDSWriter writes it (`zip_data` null when uncompressed)."""

    raw_data: Any
    samples: Any
    column_names: Any
    column_encodings: Any
    column_sizes: Any
    zip_data: Any = None
    compression: Optional[str] = None
    format: Any = None


@dataclass(frozen=True)
class _Index:
    """index.json: its format version and its shards' objects."""

    version: Any = None
    shards: Any = None


def _entry(root: str, shard: Any) -> Tuple[ShardEntry, str]:
    """The shard's entry from its index.json object, and what is wrong with it ('' when nothing is);
    KeyError, TypeError or ValueError where the object is no MDS shard entry."""
    listed = parse(_ListedShard, shard)
    raw = parse(_ShardFile, listed.raw_data)
    stored = parse(_ShardFile, listed.zip_data) if listed.zip_data else raw
    basename, compression = stored.basename, listed.compression
    entry = ShardEntry(f"{root.rstrip('/')}/{basename}", int(listed.samples), tuple(listed.column_names),
                       tuple(listed.column_encodings), tuple(listed.column_sizes),
                       compression.split(":", 1)[0] if compression else None, int(raw.bytes), int(stored.bytes))
    name = PurePosixPath(basename)
    if not basename or name.is_absolute() or ".." in name.parts or "\\" in basename:
        return entry, f"named {basename!r}, outside the folder: not read"
    if listed.format != NAME:
        return entry, f"a {listed.format!r} shard; dataset=mds reads MDS shards only"
    if entry.compression not in COMPRESSIONS:
        return entry, (f"compressed with {compression!r}; dataset=mds reads {ZSTD}, {GZIP} or uncompressed shards "
                       "(MDSWriter's compression=)")
    if not entry.header_bytes <= entry.raw_bytes < MAX_RAW_BYTES:
        return entry, (f"{entry.raw_bytes} bytes as written, which fit no MDS shard of {entry.samples} samples (its "
                       "offsets table, and at most the 4 GiB its uint32 offsets reach)")
    return entry, ""


def _columns_problem(entry: ShardEntry, image_key: str, label_key: Optional[str]) -> str:
    """Why the shard's columns do not give an image and a label ('' when they do)."""
    have = ", ".join(f"{c} ({e})" for c, e in zip(entry.columns, entry.encodings))
    wanted = ((image_key, "image_key", ENCODED_IMAGES + (RAW_PIXELS,)),
              (label_key, "label_key", INT_LABELS + (TEXT_INT,)))
    for column, key, accepted in wanted:
        if column is None:
            continue
        if column not in entry.columns:
            return f"no column {column!r} (dataset.{key}; it has {have})"
        encoding = entry.encodings[entry.columns.index(column)]
        if _encoding_name(encoding) not in accepted:
            return f"column {column!r} holds {encoding}, not one of {', '.join(accepted)} (dataset.{key})"
    return ""


def _offsets(head: bytes, entry: ShardEntry) -> Tuple[int, ...]:
    """The offsets table from a shard's first `header_bytes`; ValueError where it does not fit the shard."""
    if len(head) < entry.header_bytes:
        raise ValueError(f"it holds {len(head)} bytes, short of its offsets table")
    count, *offsets = struct.unpack_from(f"<{entry.samples + 2}I", head)
    if count != entry.samples:
        raise ValueError(f"it holds {count} samples where {INDEX_FILE} says {entry.samples}")
    if offsets[0] < entry.header_bytes or offsets[-1] != entry.raw_bytes or \
            any(a > b for a, b in zip(offsets, offsets[1:])):
        raise ValueError(f"its offsets table does not fit its {entry.raw_bytes} bytes")
    return tuple(offsets)


def _index_shards(stored: Any) -> List[Any]:
    """The shards' objects of a version INDEX_VERSION index; ValueError for any other."""
    index = parse(_Index, stored)
    if index.version != INDEX_VERSION or not isinstance(index.shards, tuple):
        raise ValueError(f"no version {INDEX_VERSION} index of shards")
    return index.shards


def _check_file(entry: ShardEntry) -> str:
    """Why the shard's file cannot be read as the index says ('' when it can): it must be a regular file
    of the size the index gives, and an uncompressed one's offsets table must fit it."""
    odd = not_regular(entry.location)
    if odd:
        return odd
    fs, path = url_fs(entry.location)
    try:
        size = fs.size(path)
        if size != entry.stored_bytes:
            what = "truncated shard" if size < entry.stored_bytes else "a shard of another size"
            return f"{what}: {size} bytes where {INDEX_FILE} says {entry.stored_bytes}"
        if entry.compression is None:
            with fs.open(path, "rb") as f:
                _offsets(f.read(entry.header_bytes), entry)
    except FileNotFoundError:
        return f"no such shard (listed in {INDEX_FILE})"
    except ValueError as exc:
        return f"not an MDS shard: {exc}"
    except Exception as exc:
        if is_url(entry.location) or not isinstance(exc, OSError):
            raise read_failure(entry.location, exc) from None
        return f"cannot read it: {exc}"
    return ""


def _decompressed(entry: ShardEntry, data: bytes) -> bytes:
    """The shard as written, from its stored bytes; no more than one byte past its size as written is
    produced, whatever the stored bytes claim."""
    zstandard = require_library("zstandard", FEATURE) if entry.compression == ZSTD else None
    limit = entry.raw_bytes + 1
    try:
        if zstandard is not None:
            with zstandard.ZstdDecompressor().stream_reader(data) as reader:
                raw = reader.read(limit)
        else:
            raw = zlib.decompressobj(GZIP_WBITS).decompress(data, limit)
    except Exception as exc:  # zlib.error, zstandard.ZstdError: the stored bytes are damaged
        raise DatasetError(f"{NAME}: {entry.location}: not a readable {entry.compression} shard ({exc})") from None
    if len(raw) != entry.raw_bytes:
        raise DatasetError(f"{NAME}: {entry.location}: {len(raw) if len(raw) < limit else 'more'} bytes decompressed "
                           f"where {INDEX_FILE} says {entry.raw_bytes}")
    return raw


def _shard_offsets(entry: ShardEntry, head: bytes) -> Tuple[int, ...]:
    """`_offsets` while a shard is read: one line naming the shard where they do not fit it."""
    try:
        return _offsets(head, entry)
    except ValueError as exc:
        raise DatasetError(f"{NAME}: {entry.location}: not an MDS shard: {exc}") from None


class MDSShards(ShardFiles, ShardedPlan, IterableDataset):
    """Yields `(index, image, label)` for this reader's shards: the image as stored (see the module doc),
    the label the integer in `label_key` (0 for every sample when it is null)."""

    def __init__(self, input_dir: str, image_key: str = "image", label_key: Optional[str] = "label",
                 on_bad_sample: str = "fail"):
        require_names(NAME, "a folder or a URL", input_dir=input_dir)
        require_names(NAME, "a column name", image_key=image_key, label_key=label_key)
        self.input_dir = input_dir
        self.image_key = image_key
        self.label_key = label_key
        self.on_bad_sample = check_policy(NAME, on_bad_sample)
        entries, problems = [], []
        shards = read_index(NAME, input_dir, "an MDS index", "no MDS set (MDSWriter writes one)", _index_shards)
        for position, shard in enumerate(shards):
            try:
                entry, problem = _entry(input_dir, shard)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise DatasetError(f"{NAME}: {input_dir}/{INDEX_FILE}: shard {position} is no MDS shard entry "
                                   f"({type(exc).__name__}: {exc})") from None
            problem = problem or _columns_problem(entry, image_key, label_key) or _check_file(entry)
            if problem:
                problems.append(f"{entry.location}: {problem}")
            elif entry.samples:
                entries.append(entry)
        if any(entry.compression == ZSTD for entry in entries):
            require_library("zstandard", FEATURE)
        self._note = bad_input(NAME, problems, self.on_bad_sample, len(entries), f"no samples in {input_dir}")
        self.shards = tuple(entries)
        self.locations = tuple(entry.location for entry in entries)
        self.sizes = tuple(entry.stored_bytes for entry in entries)
        self.offsets = ShardOffsets([entry.samples for entry in entries])
        self.skipped = {"shards": len(problems)} if problems else {}
        self.reads = FileReads()

    def shard_samples(self, shard: int) -> Iterator[Dict[str, bytes]]:
        """Each sample of shard `shard` in order, as its columns' stored bytes by name, read through this
        process's FileReads: an uncompressed shard a sample at a time, a compressed one whole."""
        entry = self.shards[shard]
        whole = entry.compression is not None
        with self.reads.open(entry.location) as stream:
            if whole:
                data = _decompressed(entry, stream.read(entry.stored_bytes + 1))
                offsets = _shard_offsets(entry, data)
            else:
                offsets = _shard_offsets(entry, stream.read(entry.header_bytes))
                stream.read(offsets[0] - entry.header_bytes)  # the writer's config
            for position, (begin, end) in enumerate(zip(offsets, offsets[1:])):
                sample = data[begin:end] if whole else stream.read(end - begin)
                try:
                    yield dict(zip(entry.columns, sample_columns(sample, entry.sizes)))
                except ValueError as exc:
                    raise DatasetError(f"{NAME}: {entry.location}: sample {position}: not an MDS sample "
                                       f"({exc})") from None

    def _image(self, entry: ShardEntry, raw: bytes) -> Any:
        if _encoding_name(entry.encodings[entry.columns.index(self.image_key)]) == RAW_PIXELS:
            return _pil_image(raw)
        return rgb_from(io.BytesIO(raw))

    def _label(self, entry: ShardEntry, columns: Dict[str, bytes]) -> int:
        if self.label_key is None:
            return 0
        return decode_int(entry.encodings[entry.columns.index(self.label_key)], columns[self.label_key])

    def __iter__(self) -> Iterator[Tuple[int, Any, int]]:
        for shard in split(range(len(self.shards)), *reader_position()):
            entry = self.shards[shard]
            for position, columns in enumerate(self.shard_samples(shard)):
                yield (self.offsets.index(shard, position), self._image(entry, columns[self.image_key]),
                       self._label(entry, columns))

    def identity(self) -> dict:
        """The folder, the shard and sample counts (each shard's too), the columns, the compressions and a
        digest of each shard's name and size."""
        return {
            "name": NAME,
            "input_dir": self.input_dir,
            "shards": len(self.shards),
            # Each shard's samples: how unevenly the shards load the readers (pipebench.model.shards.uneven_line).
            "shard_samples": list(self.offsets.counts),
            "num_samples": len(self),
            "image_key": self.image_key,
            "label_key": self.label_key,
            "compression": sorted({entry.compression or "none" for entry in self.shards}),
            "content_digest": self.content_digest(),
            **({"skipped": self.skipped} if self.skipped else {}),
        }
