"""LitData's optimized chunks (`dataset=litdata`): `litdata.StreamingDataset` over a folder that
`litdata.optimize` (or `pipebench dataset convert --to litdata`) wrote.

Each item is a dict; `image_key` holds the image, `label_key` an integer label, and `index_key` the
sample's index in the set, which the exactly-once check reads (litdata splits chunks across ranks and
workers itself, and shuffles them, so a reader's place in its stream says nothing). Items without that
field are known by their position in the set, the global index litdata's own sampler gives each item
(datasets/litdata_items.py).

The image field may hold any serializer litdata writes an image with: `bytes` (what convert writes),
`jpeg` (a JPEG opened with PIL: the file's bytes) and `image:<ext>` (`litdata.types.Image`): the chain
gets the encoded image, opened lazily (datasets/lazy_image.py), so the decode stays a timed step. `pil`
(any other PIL image) holds raw pixels, not a file: litdata's own deserializer gives the decoded image,
so that set's decode is in the dataset's load row, which the plan-time note says (`plan_notes`).

litdata reads its chunks itself, not through pipebench's FileReads: the read columns stay empty, and
`dataset.cache` / `dataset.storage` do nothing here (the job says so). Building the dataset reads the
folder's index.json (a regular file, at most shard_split's MAX_INDEX_BYTES: a FIFO or a device is never
opened) and checks it against the chunks before any job, each in one line naming the file: a chunk name
that leaves the folder, a chunk missing, not a regular file, shorter than index.json says or too short
to hold the items it counts, and items without the named fields. litdata cannot read a set with a chunk
left out, so there is no `on_bad_sample=skip` for chunks. From a bucket, access refused is named as
such, and an `http://` endpoint, which litdata's downloader refuses, is one line naming it.
"""

from __future__ import annotations

import io
import json
import logging
import posixpath
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from PIL import Image
from torch.utils.data import IterableDataset

from pipebench.base.errors import DatasetError
from pipebench.base.typed_json import parse
from pipebench.storage.dataset_contract import DatasetContract
from pipebench.storage.object_store import access_denied, is_url, read_failure, url_fs

from .checks import require_int
from .lazy_image import rgb_from
from .shard_split import (INDEX_FILE, ShardFiles, ShardOffsets, not_regular, read_index, require_library,
                          require_names)

__all__ = ["LitDataChunks", "write_litdata"]

NAME = "litdata"
FEATURE = "dataset=litdata"
# The serializers litdata writes an image with whose bytes are the encoded file (`image:<ext>` is
# keyed `image`); the chain gets them undecoded.
ENCODED_FORMATS = ("bytes", "jpeg", "image")
# litdata's PIL serializer: raw pixels, which its deserializer turns back into a decoded image.
DECODED_FORMAT = "pil"
INT_FORMAT = "int"
# A chunk of N items starts with their count and N + 1 offsets, each a uint32 (litdata's writer).
HEADER_BYTES = 4
# litdata downloads a bucket's chunks through obstore, which refuses a plain-http endpoint (BadScheme).
REFUSED_SCHEME = "http://"


@dataclass(frozen=True)
class IndexConfig:
    """index.json's `config`: the items' flattened field formats and tree spec, and how the chunks are
    stored (compressed or encrypted chunks are not checked against their sizes)."""

    data_format: Any
    data_spec: Any
    compression: Any = None
    compression_level: Any = None
    encryption: Any = None


@dataclass(frozen=True)
class ChunkEntry:
    """One chunk as index.json lists it: its file, its item count and its size in bytes."""

    filename: Any = None
    chunk_size: Any = None
    chunk_bytes: Any = None


@dataclass(frozen=True)
class LitDataIndex:
    """index.json as litdata's writer writes it: the `config` and the `chunks` entries, still unchecked."""

    config: Mapping[str, Any]
    chunks: List[Any]


def _litdata() -> Any:
    return require_library("litdata", FEATURE)


def _field_formats(config: IndexConfig, where: str) -> Dict[str, str]:
    """Each item field's data format, from index.json's flattened formats and the items' tree spec."""
    from litdata.utilities._pytree import tree_unflatten, treespec_loads

    try:
        fields = tree_unflatten(config.data_format, treespec_loads(config.data_spec))
    except Exception as exc:  # litdata's own parse of a damaged spec raises what it raises
        raise DatasetError(f"{NAME}: {where}: not a LitData index (its data_spec: {exc})") from None
    if not isinstance(fields, dict) or not all(isinstance(v, str) for v in fields.values()):
        raise DatasetError(f"{NAME}: {where}: items are not flat dicts of fields, so no named image "
                           f"(dataset.image_key) can be read")
    return fields


def _check_fields(fields: Dict[str, str], image_key: str, label_key: Optional[str], index_key: Optional[str],
                  where: str) -> Tuple[str, Optional[str], Optional[str]]:
    """The image field's serializer and the label and index fields read (None where the items have no
    such field: labels 0, each item known by its position), each named field checked against `fields`."""
    have = ", ".join(f"{k} ({v})" for k, v in fields.items()) or "none recorded"
    image = fields.get(image_key)
    serializer = image and image.split(":", 1)[0]  # `image:jpg` is written by the `image` serializer
    if serializer not in (*ENCODED_FORMATS, DECODED_FORMAT):
        raise DatasetError(f"{NAME}: {where}: items have no image field {image_key!r} (dataset.image_key; "
                           f"one of litdata's {', '.join((*ENCODED_FORMATS, DECODED_FORMAT))} serializers; "
                           f"fields: {have})")
    for role, name in (("label_key", label_key), ("index_key", index_key)):
        if name is not None and name in fields and fields[name] != INT_FORMAT:
            raise DatasetError(f"{NAME}: {where}: items have no {INT_FORMAT} field {name!r} (dataset.{role}; "
                               f"fields: {have})")
    return serializer, *(name if name in fields else None for name in (label_key, index_key))


def _leaves_folder(name: object) -> bool:
    """Whether a chunk name in index.json is not a plain name below the folder."""
    if not isinstance(name, str) or not name or "://" in name or "\\" in name or posixpath.isabs(name):
        return True
    normal = posixpath.normpath(name)
    return normal == ".." or normal.startswith("../")


def _check_chunks(fs: Any, root: str, config: IndexConfig, chunks: List[Any],
                  input_dir: str) -> Tuple[List[str], List[int], List[int]]:
    """Each chunk's location, real size and item count, checked against index.json: inside the folder,
    a regular file, as long as index.json says, and long enough for the items it counts."""
    plain = not (config.compression or config.compression_level or config.encryption)
    paths, sizes, counts = [], [], []
    for listed in chunks:
        if not isinstance(listed, dict):
            raise DatasetError(f"{NAME}: {input_dir}/{INDEX_FILE}: not a LitData index (a chunk entry {listed!r})")
        chunk = parse(ChunkEntry, listed)
        name = chunk.filename
        if _leaves_folder(name):
            raise DatasetError(f"{NAME}: {input_dir}/{INDEX_FILE}: chunk name {name!r} leaves the folder, so not read")
        path = f"{root}/{name}"
        where = fs.unstrip_protocol(path) if is_url(input_dir) else path
        odd = not_regular(where)
        if odd:
            raise DatasetError(f"{NAME}: {where}: {odd}")
        try:
            stored = fs.size(path)
        except FileNotFoundError:
            raise DatasetError(f"{NAME}: {where}: no such chunk (listed in {INDEX_FILE})") from None
        except PermissionError as exc:
            raise access_denied(NAME, where, exc, input_dir) from None
        except Exception as exc:
            raise read_failure(input_dir, exc, where) from None
        size, count, listed_bytes = int(stored), chunk.chunk_size, chunk.chunk_bytes
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise DatasetError(f"{NAME}: {where}: {INDEX_FILE} gives it chunk_size {count!r}, not a count of items")
        if plain and isinstance(listed_bytes, int) and size < listed_bytes:
            raise DatasetError(f"{NAME}: {where}: truncated chunk: {size} bytes of {listed_bytes}")
        if plain and size < HEADER_BYTES * (count + 2):
            raise DatasetError(f"{NAME}: {where}: {INDEX_FILE} says it holds {count} items, whose count and offsets "
                               f"alone take {HEADER_BYTES * (count + 2)} bytes, but the file has {size}")
        paths.append(where)
        sizes.append(size)
        counts.append(count)
    return paths, sizes, counts


def _check_endpoint(fs: Any, input_dir: str) -> None:
    """One line, before any job, when litdata's downloader would refuse the bucket's endpoint."""
    if not is_url(input_dir):
        return
    # The endpoint s3fs's client resolved through botocore's chain, the one litdata's boto3 client gets.
    endpoint = getattr(getattr(getattr(fs, "s3", None), "meta", None), "endpoint_url", None)
    from litdata.constants import _OBSTORE_AVAILABLE

    if endpoint and endpoint.lower().startswith(REFUSED_SCHEME) and bool(_OBSTORE_AVAILABLE):
        raise DatasetError(f"{NAME}: {input_dir}: the endpoint {endpoint} is plain http, which litdata's "
                           "downloader (obstore) refuses (BadScheme): litdata reads a bucket only through an "
                           "https:// endpoint (AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL) or AWS's own")


class LitDataChunks(ShardFiles, DatasetContract, IterableDataset):
    """Yields `(index, image, label)` from litdata's StreamingDataset: the image undecoded where litdata
    kept the encoded file, the label the item's `label_key` field (0 for every sample when it is null)."""

    def __init__(self, input_dir: str, image_key: str = "image", label_key: Optional[str] = "label",
                 index_key: Optional[str] = "index", shuffle: bool = False, seed: int = 0):
        _litdata()
        require_names(NAME, "a folder or a URL", input_dir=input_dir)
        if not isinstance(shuffle, bool):
            raise DatasetError(f"{NAME}: shuffle must be true or false, got {shuffle!r}")
        require_int(NAME, "seed", seed, 0)
        self.input_dir = input_dir
        self.image_key, self.label_key, self.index_key = image_key, label_key, index_key
        require_names(NAME, "a field name", image_key=image_key, label_key=label_key, index_key=index_key)
        self.shuffle = shuffle
        self.seed = seed
        fs, root = url_fs(input_dir)
        root = root.rstrip("/")
        where = f"{input_dir}/{INDEX_FILE}"
        stored = read_index(NAME, input_dir, "a LitData index",
                            "no optimized LitData set (`pipebench dataset convert --to litdata` writes one)",
                            lambda stored: stored)
        try:
            index = parse(LitDataIndex, stored)
        except (KeyError, TypeError):
            index = None
        if index is None or not isinstance(index.config, dict) or not isinstance(index.chunks, tuple):
            raise DatasetError(f"{NAME}: {where}: not a LitData index (no config and chunks)")
        _check_endpoint(fs, input_dir)
        try:
            config = parse(IndexConfig, index.config)
        except KeyError as exc:  # as litdata's own reader would fail on it
            raise DatasetError(f"{NAME}: {where}: not a LitData index (its data_spec: {exc})") from None
        self.image_format, self.label_field, self.index_field = _check_fields(
            _field_formats(config, where), image_key, label_key, index_key, where)
        paths, sizes, counts = _check_chunks(fs, root, config, index.chunks, input_dir)
        self.locations, self.sizes, self.offsets = tuple(paths), tuple(sizes), ShardOffsets(counts)
        self._note = ""
        self._stream: Optional[Any] = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_stream": None}  # each process opens its own StreamingDataset

    def plan_notes(self) -> Tuple[str, ...]:
        """The plan-time notes: a label field the items lack (every label 0), and images stored as
        pixels, whose decode is then the load's."""
        notes = []
        if self.label_key is not None and self.label_field is None:
            notes.append(f"{NAME}: {self.input_dir}: items have no field {self.label_key!r} "
                         "(dataset.label_key), so every label is 0")
        if self.image_format == DECODED_FORMAT:
            notes.append(f"{NAME}: {self.input_dir}: field {self.image_key!r} holds litdata's "
                         f"{DECODED_FORMAT} serializer (raw pixels, no encoded file), so litdata's deserializer "
                         "decodes it: the decode is in the dataset's load row and the decode row is empty")
        return tuple(notes)

    def _items(self) -> Any:
        if self._stream is None:
            from .litdata_items import PositionedStream, undecoded_serializers

            # litdata logs its cache choices at INFO on every epoch, into the job's output.
            logging.getLogger(NAME).setLevel(logging.WARNING)
            self._stream = PositionedStream(self.input_dir, shuffle=self.shuffle, seed=self.seed, drop_last=False,
                                            serializers=undecoded_serializers())
        return self._stream

    def __iter__(self) -> Iterator[Tuple[int, Any, int]]:
        image_key, label_key = self.image_key, self.label_field
        for position, item in self._items():
            label = int(item[label_key]) if label_key is not None else 0
            index = int(item[self.index_field]) if self.index_field is not None else position
            image = item[image_key]
            if isinstance(image, Image.Image):
                yield index, image if image.mode == "RGB" else image.convert("RGB"), label
            else:
                yield index, rgb_from(io.BytesIO(image)), label

    def describe(self, index: int) -> str:
        if self.index_field is None:
            return f"{self.input_dir}, item {index} of the set"
        return f"{self.input_dir}, item with {self.index_field}={index}"

    def identity(self) -> dict:
        """The folder, its chunk and sample counts, the fields read and the image's serializer, and a
        digest of each chunk's name and size."""
        return {
            "name": NAME,
            "input_dir": self.input_dir,
            "chunks": len(self.locations),
            "num_samples": len(self),
            "image_key": self.image_key,
            "label_key": self.label_key,
            "index_key": self.index_key,
            "label_read": self.label_field,
            "index_read": self.index_field or "position",
            "image_format": self.image_format,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "content_digest": self.content_digest(),
        }


def write_litdata(samples: Iterable[Tuple[str, bytes, int]], out: Any, shard_size: int,
                  progress: Callable[[int], None] = lambda done: None) -> List[str]:
    """Write `(source path, encoded image, label)` samples as LitData chunks of `shard_size` items,
    each `{index, image (bytes), label}`, with litdata's BinaryWriter (what `litdata.optimize` runs in
    each of its workers; in this process, so the samples stream through without a copy a worker);
    returns the chunks written."""
    _litdata()
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(out), chunk_size=shard_size)
    for number, (_, data, label) in enumerate(samples):
        writer.add_item(number, {"index": number, "image": data, "label": int(label)})
        progress(number + 1)
    writer.done()
    writer.merge()
    with open(out / INDEX_FILE) as f:
        index = parse(LitDataIndex, json.load(f))
    return [str(out / parse(ChunkEntry, chunk).filename) for chunk in index.chunks]
