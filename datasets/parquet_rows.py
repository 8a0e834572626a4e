"""Parquet files of encoded images (`dataset=parquet`): the layout Hugging Face `datasets` publishes.

`files` takes a path, a glob or a list of either (local, or URLs fsspec opens). `image_column` holds
HF's Image struct (`{bytes, path}`) or plain binary; `label_column` an integer label (null: none). A
struct whose `bytes` is null names the image by its `path` (what `Dataset.cast_column('image', Image())`
of file paths, then `to_parquet`, writes): that file is read, absolute, a URL, or relative to the
Parquet file's folder, as HF's own Image feature reads it, through the job's FileReads in the load.
Files are read with pyarrow one row group at a time, in two forms:
- map-style (`streaming=false`): sample i is row i of the files in order; the sampler picks the order,
  and each reader keeps its last ROW_GROUPS_KEPT row groups, so reading in order reads each row group
  once and shuffled reading pays a row group a sample when the set is larger than that (the line that
  says so: pipebench/model/shards.py);
- streaming (`streaming=true`): an IterableDataset whose shards are the row groups, split across ranks
  and workers as webdataset splits tar shards (pipebench/model/shards.py), each read once, in order.

The chain gets the encoded image, opened lazily (datasets/lazy_image.py), so the decode stays a timed
step. Files are read through the job's FileReads, so the bytes, the cold cache and the slow-storage
what-if apply. Building the dataset reads each file's footer: the row counts, and the bad input (a
missing file, a file without the named column or whose column holds no image bytes), one line naming
the file and column, or left out and counted under `on_bad_sample=skip`. Where the footer's
statistics count rows without bytes, it also reads those row groups' image column (null bytes cost
nothing) and checks each such row has a path whose file exists (every local one; a URL's first, one
request a Parquet file), so a set of paths is checked before any job too. A URL that cannot be
read at all is one line naming it, whatever the policy (pipebench/storage/object_store.py).
"""

from __future__ import annotations

import glob
import io
import os
import posixpath
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from torch.utils.data import Dataset, IterableDataset

from pipebench.base.errors import DatasetError
from pipebench.config.specs import JobSpec
from pipebench.model.shards import ROW_GROUP_ROWS, ROW_GROUPS_KEPT, random_access_line, split
from pipebench.storage.dataset_contract import DatasetContract
from pipebench.storage.file_reads import FileReads, PerThread
from pipebench.storage.object_store import is_url, read_failure, unreadable, url_fs
from pipebench.storage.rank_info import reader_position

from .lazy_image import rgb_from
from .sharded_plan import ShardedPlan
from .shard_split import (ShardFiles, ShardOffsets, bad_input, check_policy, name_list, not_regular,
                          require_library, require_names)

__all__ = ["ParquetRows", "ParquetStream", "expand_files", "parquet_dataset", "write_parquet"]

NAME = "parquet"
FEATURE = "dataset=parquet"
# The fields of HF's Image struct: the encoded file, or where to read it when that is null.
IMAGE_BYTES_FIELD, IMAGE_PATH_FIELD = "bytes", "path"
# What `convert` names its files (their row groups: ROW_GROUP_ROWS rows, pipebench/model/shards.py).
FILE_PATTERN = "part-{:05d}.parquet"
GLOB_CHARS = "*?["


def _pq() -> Any:
    return require_library("pyarrow.parquet", FEATURE)


def _glob(pattern: str) -> List[str]:
    if not is_url(pattern):
        return sorted(glob.glob(pattern))
    fs, _ = url_fs(pattern)
    protocol = pattern.split("://", 1)[0]
    try:
        return sorted(f"{protocol}://{path}" for path in fs.glob(pattern))
    except Exception as exc:  # the store's own errors (botocore's): the URL is unreadable
        raise unreadable(pattern, exc) from None


def expand_files(files: Union[str, Sequence[str]]) -> List[str]:
    """Every file `files` names: each glob expanded (sorted), each plain path kept, in the order given."""
    found: List[str] = []
    for item in name_list(NAME, "a path or a glob", "files", files):
        if any(char in item for char in GLOB_CHARS):
            matched = _glob(item)
            if not matched:
                raise DatasetError(f"{NAME}: no file matches {item}")
            found += matched
        else:
            found.append(item)
    return found


@dataclass(frozen=True)
class FileScan:
    """One file's footer: its size, the rows of each row group, whether the image column is HF's struct,
    whether rows of it name their image by path, and what is wrong with the file ('' when nothing is)."""

    path: str
    size: int
    row_groups: Tuple[int, ...]
    struct: bool
    problem: str
    by_path: bool = False


def _image_kind(column_type: Any) -> Optional[bool]:
    """True for HF's {bytes, path} struct, False for plain binary, None for anything else."""
    import pyarrow as pa

    def binary(kind: Any) -> bool:
        return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)

    if pa.types.is_struct(column_type):
        index = column_type.get_field_index(IMAGE_BYTES_FIELD)
        return True if index >= 0 and binary(column_type.field(index).type) else None
    return False if binary(column_type) else None


def scan_file(path: str, image_column: str, label_column: Optional[str], reads: FileReads) -> FileScan:
    """Read one file's footer and check its columns; a FIFO or a device is named, never opened."""
    pq = _pq()
    import pyarrow as pa

    odd = not_regular(path)
    if odd:
        return FileScan(path, 0, (), False, odd)
    try:
        with reads.open(path) as stream:
            metadata = pq.ParquetFile(stream).metadata
            size = stream.seek(0, io.SEEK_END)
    except FileNotFoundError:
        return FileScan(path, 0, (), False, "no such file")
    except (OSError, pa.ArrowException) as exc:
        return FileScan(path, 0, (), False, f"not a readable Parquet file ({str(exc).splitlines()[0]})")
    except Exception as exc:
        raise read_failure(path, exc) from None
    schema = metadata.schema.to_arrow_schema()
    groups = tuple(metadata.row_group(k).num_rows for k in range(metadata.num_row_groups))
    names = ", ".join(schema.names)
    for key, column in (("image_column", image_column), ("label_column", label_column)):
        if column is not None and column not in schema.names:
            return FileScan(path, size, groups, False, f"no column {column!r} (dataset.{key}; it has {names})")
    struct = _image_kind(schema.field(image_column).type)
    if struct is None:
        return FileScan(path, size, groups, False, f"column {image_column!r} holds {schema.field(image_column).type}, "
                        "not image bytes (HF's {bytes, path} struct or binary)")
    if label_column is not None and not pa.types.is_integer(schema.field(label_column).type):
        return FileScan(path, size, groups, struct, f"column {label_column!r} holds "
                        f"{schema.field(label_column).type}, not integer labels")
    unread = _groups_without_bytes(metadata, image_column) if struct else []
    if not unread:
        return FileScan(path, size, groups, struct, "")
    return FileScan(path, size, groups, struct, _check_paths(path, image_column, unread, reads), by_path=True)


def _groups_without_bytes(metadata: Any, image_column: str) -> List[int]:
    """The row groups whose footer statistics count rows with null image bytes, or count nothing."""
    leaf = f"{image_column}.{IMAGE_BYTES_FIELD}"
    unread = []
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        column = next(group.column(j) for j in range(group.num_columns) if group.column(j).path_in_schema == leaf)
        stats = column.statistics
        if stats is None or not stats.has_null_count or stats.null_count:
            unread.append(g)
    return unread


def resolve_image_path(parquet_path: str, image_path: str) -> str:
    """Where an Image struct's `path` points: a URL or an absolute path as written, else relative to the
    Parquet file's folder."""
    if is_url(image_path) or os.path.isabs(image_path):
        return image_path
    if is_url(parquet_path):
        return posixpath.join(posixpath.dirname(parquet_path), image_path)
    return os.path.join(os.path.dirname(parquet_path), image_path)


def _check_paths(path: str, image_column: str, unread: Sequence[int], reads: FileReads) -> str:
    """What is wrong with the rows of `unread` row groups that have no image bytes ('' when nothing is):
    a row with no path either, or a path naming no file (each local one checked; of URLs, the first)."""
    with reads.open(path) as stream:
        parquet = _pq().ParquetFile(stream)
        if parquet.schema_arrow.field(image_column).type.get_field_index(IMAGE_PATH_FIELD) < 0:
            return f"column {image_column!r} holds rows with no image bytes and has no {IMAGE_PATH_FIELD!r} field"
        missing, checked_url = [], False
        for g in unread:
            images = parquet.read_row_group(g, columns=[image_column], use_threads=False).column(0).combine_chunks()
            for row, (no_bytes, named) in enumerate(zip(images.field(IMAGE_BYTES_FIELD).is_null().to_pylist(),
                                                        images.field(IMAGE_PATH_FIELD).to_pylist())):
                if not no_bytes:
                    continue
                if named is None:
                    return f"row group {g}, row {row}: column {image_column!r} holds neither image bytes nor a path"
                target = resolve_image_path(path, named)
                if is_url(target):
                    if not checked_url:
                        checked_url = True
                        missing += [] if _url_exists(target) else [(g, row, target)]
                elif not os.path.isfile(target):
                    missing.append((g, row, target))
    if not missing:
        return ""
    g, row, target = missing[0]
    more = f" (and {len(missing) - 1} more rows)" if len(missing) > 1 else ""
    return (f"row group {g}, row {row}: column {image_column!r} has no image bytes and its path names {target}, "
            f"{not_regular(target) or 'no such file'}{more}")


def _url_exists(url: str) -> bool:
    fs, where = url_fs(url)
    try:
        return bool(fs.isfile(where))
    except Exception as exc:  # the store's own errors (botocore's): the URL is unreadable
        raise unreadable(url, exc) from None


class _ParquetBase(PerThread, ShardFiles, DatasetContract):
    """The files scanned and checked, the row-group reads shared by both forms, and what a job asks of
    a dataset (`files`, `identity`, `notes`, `describe`)."""

    streaming = False

    def __init__(self, files: Union[str, Sequence[str]], image_column: str = "image",
                 label_column: Optional[str] = "label", on_bad_sample: str = "fail"):
        require_names(NAME, "a column name", image_column=image_column, label_column=label_column)
        super().__init__()  # open files and kept row groups belong to one thread of one process
        self.pattern = files
        self.image_column = image_column
        self.label_column = label_column
        self.on_bad_sample = check_policy(NAME, on_bad_sample)
        self.reads = FileReads()
        scans = [scan_file(path, image_column, label_column, self.reads) for path in expand_files(files)]
        problems = [f"{s.path}: {s.problem}" for s in scans if s.problem]
        kept = [s for s in scans if not s.problem and sum(s.row_groups)]
        self._note = bad_input(NAME, problems, self.on_bad_sample, len(kept), f"no rows in {files!r}")
        self.paths = self.locations = tuple(s.path for s in kept)
        self.sizes = tuple(s.size for s in kept)
        self.structs = tuple(s.struct for s in kept)
        self.by_path = tuple(s.by_path for s in kept)
        # Every row group of every file, in order: (file, row group), and where its rows start.
        self.groups = tuple((f, g) for f, s in enumerate(kept) for g in range(len(s.row_groups)))
        self.offsets = ShardOffsets([rows for s in kept for rows in s.row_groups])
        self.skipped = {"files": len(problems)} if problems else {}

    def _file(self, f: int) -> Any:
        """File `f` opened through FileReads, once per thread (pyarrow seeks it; threads must not share)."""
        opened = self.mine("files", dict)
        if f not in opened:
            # pre_buffer off: pyarrow's pre-buffering reads in its own IO threads, where FileReads counts
            # nothing for the sample and the slow-storage what-if sleeps outside the sample's load step.
            opened[f] = _pq().ParquetFile(self.reads.open(self.paths[f]), pre_buffer=False)
        return opened[f]

    def _row_group(self, group: int) -> Tuple[List[Union[bytes, str, None]], List[int]]:
        """The encoded images (or, for a struct row without bytes, the file its path names) and labels of
        row group `group` (of self.groups)."""
        f, g = self.groups[group]
        columns = [self.image_column, *([self.label_column] if self.label_column else [])]
        table = self._file(f).read_row_group(g, columns=columns, use_threads=False)
        images = table.column(self.image_column)
        labels = table.column(self.label_column).to_pylist() if self.label_column else [0] * table.num_rows
        if not self.structs[f]:
            return images.to_pylist(), labels
        images = images.combine_chunks()
        encoded = images.field(IMAGE_BYTES_FIELD).to_pylist()
        if self.by_path[f]:
            named = images.field(IMAGE_PATH_FIELD).to_pylist()
            encoded = [data if data is not None or path is None else resolve_image_path(self.paths[f], path)
                       for data, path in zip(encoded, named)]
        return encoded, labels

    def _sample(self, images: List[Union[bytes, str, None]], labels: List[int], group: int,
                row: int) -> Tuple[Any, int]:
        data = images[row]
        if data is None:
            f, g = self.groups[group]
            raise DatasetError(f"{NAME}: {self.paths[f]}: row group {g}, row {row}: column {self.image_column!r} "
                               "holds no image bytes")
        if isinstance(data, str):  # the file an Image struct's path names
            data = self.reads.read(data) if not is_url(data) else self._read_url(data)
        return rgb_from(io.BytesIO(data)), int(labels[row])

    def _read_url(self, url: str) -> bytes:
        with self.reads.open(url) as stream:
            return stream.read()

    def plan_notes(self) -> Tuple[str, ...]:
        """The plan-time note of files whose image column names files by path: each sample reads one."""
        named = [path for path, by_path in zip(self.paths, self.by_path) if by_path]
        if not named:
            return ()
        return (f"{NAME}: column {self.image_column!r} of {len(named)} of {len(self.paths)} file(s) ({named[0]}"
                f"{' and more' if len(named) > 1 else ''}) names images by path, not bytes: each such sample reads "
                "the file its path names, in the dataset's load row (dataset.cache warms the Parquet files only)",)

    def describe(self, index: int) -> str:
        """The file, row group and row behind sample `index`."""
        try:
            group, row = self.offsets.locate(index)
        except IndexError:
            return f"sample {index}"
        f, g = self.groups[group]
        return f"{self.paths[f]}, row group {g}, row {row}"

    def identity(self) -> dict:
        """The files as given, the file, row-group and sample counts, the files' bytes, the columns, and a
        digest of each file's name and size."""
        return {
            "name": NAME,
            "files": self.pattern if isinstance(self.pattern, str) else list(self.pattern),
            "num_files": len(self.paths),
            "row_groups": len(self.groups),
            "num_samples": len(self),
            "file_bytes": sum(self.sizes),
            "image_column": self.image_column,
            "label_column": self.label_column,
            "streaming": self.streaming,
            **({"shards": len(self.groups), "shard_samples": list(self.offsets.counts)} if self.streaming else {}),
            "content_digest": self.content_digest(),
            **({"skipped": self.skipped} if self.skipped else {}),
        }


class ParquetRows(_ParquetBase, Dataset):
    """Map-style: sample i is the i-th row over the files in order, read by row group."""

    def __getitem__(self, index: int) -> Tuple[Any, int]:
        group, row = self.offsets.locate(range(len(self))[index])
        kept = self.mine("kept", OrderedDict)
        if group in kept:
            kept.move_to_end(group)
        else:
            kept[group] = self._row_group(group)
            while len(kept) > ROW_GROUPS_KEPT:
                kept.popitem(last=False)
        return self._sample(*kept[group], group, row)

    def plan_warnings(self, spec: JobSpec) -> Tuple[str, ...]:
        """Shuffled reads of whole row groups (pipebench/model/shards.py), from the rows a sample reads."""
        line = random_access_line(self.identity(), spec.loader.shuffle)
        return (line,) if line else ()


class ParquetStream(_ParquetBase, ShardedPlan, IterableDataset):
    """Streaming: yields `(index, image, label)` for this reader's row groups, each read once, in order."""

    streaming = True

    def __iter__(self) -> Iterator[Tuple[int, Any, int]]:
        for group in split(range(len(self.groups)), *reader_position()):
            images, labels = self._row_group(group)
            for row in range(len(images)):
                yield (self.offsets.index(group, row), *self._sample(images, labels, group, row))


def parquet_dataset(files: Union[str, Sequence[str]], image_column: str = "image",
                    label_column: Optional[str] = "label", streaming: bool = False,
                    on_bad_sample: str = "fail") -> Union[ParquetRows, ParquetStream]:
    """`dataset=parquet`'s target: the map-style form, or the streaming one when `streaming`."""
    if not isinstance(streaming, bool):
        raise DatasetError(f"{NAME}: streaming must be true or false, got {streaming!r}")
    form = ParquetStream if streaming else ParquetRows
    return form(files, image_column, label_column, on_bad_sample)


def write_parquet(samples: Iterable[Tuple[str, bytes, int]], out: Any, shard_size: int,
                  progress: Callable[[int], None] = lambda done: None) -> List[str]:
    """Write `(source path, encoded image, label)` samples as HF's layout: an `image` column of
    {bytes, path} structs and an int64 `label`, `shard_size` rows a file in row groups of ROW_GROUP_ROWS,
    with pyarrow; returns the files written."""
    pq = _pq()
    import pyarrow as pa

    image_type = pa.struct([(IMAGE_BYTES_FIELD, pa.binary()), ("path", pa.string())])
    schema = pa.schema([("image", image_type), ("label", pa.int64())])
    written: List[str] = []
    rows: List[Tuple[str, bytes, int]] = []

    def flush() -> None:
        path = str(out / FILE_PATTERN.format(len(written)))
        images = [{IMAGE_BYTES_FIELD: data, "path": os.path.basename(source)} for source, data, _ in rows]
        table = pa.table({"image": pa.array(images, image_type), "label": [label for _, _, label in rows]},
                         schema=schema)
        pq.write_table(table, path, row_group_size=ROW_GROUP_ROWS)
        written.append(path)
        rows.clear()

    for number, sample in enumerate(samples, 1):
        rows.append(sample)
        if len(rows) == shard_size:
            flush()
        progress(number)
    if rows:
        flush()
    return written
