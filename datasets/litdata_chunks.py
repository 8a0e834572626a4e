"""LitData's optimized chunks (`dataset=litdata`): `litdata.StreamingDataset` over a folder that
`litdata.optimize` (or `pipebench dataset convert --to litdata`) wrote.

Each item is a dict; `image_key` holds the encoded image as bytes, `label_key` an integer label, and
`index_key` the sample's index in the set, which the exactly-once check reads (litdata splits chunks
across ranks and workers itself, and shuffles them, so a reader's place in its stream says nothing).
The chain gets the encoded image, opened lazily (datasets/lazy_image.py), so the decode stays a timed
step.

litdata reads its chunks itself, not through pipebench's FileReads: the read columns stay empty, and
`dataset.cache` / `dataset.storage` do nothing here (the job says so). Building the dataset reads the
folder's index.json: a missing or truncated chunk, or items without the named fields, are one line
naming the file and key before any job runs. litdata cannot read a set with a chunk left out, so
there is no `on_bad_sample=skip` for chunks.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

from torch.utils.data import IterableDataset

from pipebench.base.errors import DatasetError
from pipebench.pipeline.file_reads import is_url
from pipebench.pipeline.object_store import unreadable, url_fs

from .lazy_image import rgb_from
from .shard_split import ShardFiles, require_library

__all__ = ["LitDataChunks", "write_litdata"]

NAME = "litdata"
FEATURE = "dataset=litdata"
INDEX_FILE = "index.json"
# The serializer litdata records for a bytes field: the encoded image, undecoded.
BYTES_TYPE = "bytes"


def _litdata() -> Any:
    return require_library("litdata", FEATURE)


def _check_folder(input_dir: str, keys: dict) -> Tuple[List[str], List[int], List[int]]:
    """The chunk files, their sizes and item counts from index.json, each chunk checked on disk, and
    the item's fields checked against `keys` (field role -> name or None)."""
    fs, root = url_fs(input_dir)
    index_path = f"{root.rstrip('/')}/{INDEX_FILE}"
    try:
        with fs.open(index_path, "r") as f:
            index = json.load(f)
        config, chunks = index["config"], index["chunks"]
    except FileNotFoundError:
        raise DatasetError(f"{NAME}: {input_dir}: no {INDEX_FILE}, so no optimized LitData set "
                           "(`pipebench dataset convert --to litdata` writes one)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{NAME}: {input_dir}/{INDEX_FILE}: not a LitData index ({exc})") from None
    except Exception as exc:  # a URL's store raises its own errors (botocore's)
        if is_url(input_dir):
            raise unreadable(f"{input_dir}/{INDEX_FILE}", exc) from None
        raise
    types = config.get("types") or {}
    for role, name in keys.items():
        wanted = BYTES_TYPE if role == "image_key" else "int"
        if name is not None and types.get(name) != wanted:
            have = ", ".join(f"{k} ({v})" for k, v in types.items()) or "none recorded"
            raise DatasetError(f"{NAME}: {input_dir}/{INDEX_FILE}: items have no {wanted} field {name!r} "
                               f"(dataset.{role}; fields: {have})")
    paths, sizes, counts = [], [], []
    for chunk in chunks:
        path = f"{root.rstrip('/')}/{chunk['filename']}"
        try:
            size = fs.size(path)
        except FileNotFoundError:
            raise DatasetError(f"{NAME}: {path}: no such chunk (listed in {INDEX_FILE})") from None
        if config.get("compression") is None and size < chunk["chunk_bytes"]:
            raise DatasetError(f"{NAME}: {path}: truncated chunk: {size} bytes of {chunk['chunk_bytes']}")
        paths.append(fs.unstrip_protocol(path) if is_url(input_dir) else path)
        sizes.append(size)
        counts.append(int(chunk["chunk_size"]))
    return paths, sizes, counts


class LitDataChunks(ShardFiles, IterableDataset):
    """Yields `(index, image, label)` from litdata's StreamingDataset: the image undecoded, the label
    the item's `label_key` field (0 for every sample when it is null)."""

    def __init__(self, input_dir: str, image_key: str = "image", label_key: Optional[str] = "label",
                 index_key: str = "index", shuffle: bool = False, seed: int = 0):
        _litdata()
        if not isinstance(input_dir, str) or not input_dir:
            raise DatasetError(f"{NAME}: input_dir must be a folder or a URL, got {input_dir!r}")
        if not isinstance(shuffle, bool):
            raise DatasetError(f"{NAME}: shuffle must be true or false, got {shuffle!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise DatasetError(f"{NAME}: seed must be an integer >= 0, got {seed!r}")
        self.input_dir = input_dir
        self.keys = {"image_key": image_key, "label_key": label_key, "index_key": index_key}
        for role in ("image_key", "index_key"):
            if not isinstance(self.keys[role], str) or not self.keys[role]:
                raise DatasetError(f"{NAME}: {role} must be a field name, got {self.keys[role]!r}")
        self.shuffle = shuffle
        self.seed = seed
        paths, sizes, counts = _check_folder(input_dir, self.keys)
        self.locations, self.sizes, self.counts = tuple(paths), tuple(sizes), tuple(counts)
        self._note = ""
        self._stream: Optional[Any] = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_stream": None}  # each process opens its own StreamingDataset

    def __len__(self) -> int:
        return sum(self.counts)

    def _items(self) -> Any:
        if self._stream is None:
            # litdata logs its cache choices at INFO on every epoch, into the job's output.
            logging.getLogger(NAME).setLevel(logging.WARNING)
            self._stream = _litdata().StreamingDataset(self.input_dir, shuffle=self.shuffle, seed=self.seed,
                                                       drop_last=False)
        return self._stream

    def __iter__(self) -> Iterator[Tuple[int, Any, int]]:
        image_key, label_key, index_key = (self.keys[k] for k in ("image_key", "label_key", "index_key"))
        for item in self._items():
            label = int(item[label_key]) if label_key is not None else 0
            yield int(item[index_key]), rgb_from(io.BytesIO(item[image_key])), label

    def describe(self, index: int) -> str:
        return f"{self.input_dir}, item with {self.keys['index_key']}={index}"

    def identity(self) -> dict:
        """The folder, its chunk and sample counts, the fields read, and a digest of each chunk's name and size."""
        return {
            "name": NAME,
            "input_dir": self.input_dir,
            "chunks": len(self.locations),
            "num_samples": len(self),
            **self.keys,
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
        return [str(out / chunk["filename"]) for chunk in json.load(f)["chunks"]]
