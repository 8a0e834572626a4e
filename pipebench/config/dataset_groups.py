"""The structured config of each catalogue dataset group (`dataset=webdataset`, ...): its keys, their
types and defaults, declared once. A group's YAML file (conf/dataset/) names it first in its defaults,
so a key of the wrong type is refused while Hydra composes, and `__post_init__` refuses a count out of
range when the spec is built; both in one line naming the key, before any dataset is built. The
dataset classes keep their own checks for users who build them from Python.
"""

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, List, Optional

from pipebench.config.limits import (
    MAX_DATASET_LENGTH,
    MAX_DISTINCT_SAMPLES,
    MAX_IMAGE_SIDE,
    MAX_POOL_BYTES,
    MAX_SAMPLE_ELEMENTS,
    MAX_SEED,
)
from pipebench.config.specs import Checked, bounded

# Where each group's config sits in the ConfigStore: `/dataset_schema/<group>@_here_` in its YAML.
SCHEMA_GROUP = "dataset_schema"
# A labelled set's classes: at least one, at most one a sample.
CLASSES = (1, MAX_DATASET_LENGTH)
SEEDS = (0, MAX_SEED)


@dataclass(frozen=True, kw_only=True)
class DatasetGroup(Checked):
    """A catalogue dataset's `_target_` node; `RANGES` bounds its integer keys (pipebench.config.limits)."""

    _target_: str
    PREFIX: ClassVar = "dataset."


@dataclass(frozen=True, kw_only=True)
class FileReading(DatasetGroup):
    """How the files are read (pipebench applies these; the dataset class never sees them)."""

    # warm: read once before measuring, so the page cache serves the run. cold: each file's pages are
    # dropped before it is read, so every read goes to storage, as with a set larger than RAM.
    cache: str = "warm"
    # A what-if for slow storage: every file read also sleeps latency_ms + bytes / mb_per_s (MiB/s);
    # shared_mb_per_s is one bandwidth every worker and rank of the host shares, as one disk or link
    # (null: none). Checked key by key where the spec is built (pipebench.config.specs).
    storage: Any = field(default_factory=lambda: {"latency_ms": 0, "mb_per_s": None, "shared_mb_per_s": None})


@dataclass(frozen=True, kw_only=True)
class SyntheticJpeg(FileReading):
    """A seeded cache of distinct colourful JPEGs, built once, served `length` times by cycling."""

    _target_: str = "pipebench.datasets.synthetic_jpeg.SyntheticJpegDataset"
    length: int = 10000
    num_images: int = 64
    width: int = 533
    height: int = 800
    quality: int = 90
    num_classes: int = 10
    seed: int = 0
    # null: ~/.cache/pipebench.
    cache_dir: Optional[str] = None
    RANGES: ClassVar = {"length": (1, MAX_DATASET_LENGTH), "num_images": (1, MAX_DISTINCT_SAMPLES),
                        "width": (1, MAX_IMAGE_SIDE), "height": (1, MAX_IMAGE_SIDE), "num_classes": CLASSES,
                        "seed": SEEDS}


@dataclass(frozen=True, kw_only=True)
class ImageFolder(FileReading):
    """Every image under `path` (recursive)."""

    _target_: str = "pipebench.datasets.image_folder.ImageFolderDataset"
    path: str
    num_classes: int = 10
    seed: int = 0
    RANGES: ClassVar = {"num_classes": CLASSES, "seed": SEEDS}


@dataclass(frozen=True, kw_only=True)
class RandomTensors(DatasetGroup):
    """Random uint8 tensors of `shape`, for chains that skip decoding."""

    _target_: str = "pipebench.datasets.random_tensors.RandomTensorDataset"
    shape: List[int] = field(default_factory=lambda: [3, 256, 256])
    length: int = 10000
    num_distinct: int = 64
    num_classes: int = 10
    seed: int = 0
    RANGES: ClassVar = {"length": (1, MAX_DATASET_LENGTH), "num_distinct": (1, MAX_DISTINCT_SAMPLES),
                        "num_classes": CLASSES, "seed": SEEDS}

    def __post_init__(self) -> None:
        super().__post_init__()
        for dim in self.shape:
            bounded("dataset.shape", dim, 1, MAX_SAMPLE_ELEMENTS)


@dataclass(frozen=True, kw_only=True)
class ShardedStream(FileReading):
    """An IterableDataset that shards itself by rank and DataLoader worker (shard k of ranks x workers
    reads indices k, k+n, ...). shard: false reads everything in every copy, the classic bug the
    exactly-once check catches. `source` is any map-style dataset config."""

    _target_: str = "pipebench.datasets.sharded_stream.ShardedStream"
    shard: bool = True
    source: Any = field(default_factory=lambda: asdict(RandomTensors()))


@dataclass(frozen=True, kw_only=True)
class StorageSamples(FileReading):
    """Generated samples of a training workload's sizes, read from the emulated storage (no files):
    the storage check's presets (pipebench storage-check) set the sizes."""

    _target_: str = "pipebench.datasets.storage_samples.StorageSampleDataset"
    sample_bytes: int = 114660
    sample_bytes_stdev: int = 0
    # What reaches the chain (DLIO's record_length_bytes_resize); null: sample_bytes.
    handed_bytes: Optional[int] = None
    # true: a lazily opened JPEG reaches the chain, for an image chain to decode.
    images: bool = False
    length: int = 10000
    num_distinct: int = 8
    num_classes: int = 10
    seed: int = 0
    RANGES: ClassVar = {"sample_bytes": (1, MAX_POOL_BYTES), "sample_bytes_stdev": (0, MAX_POOL_BYTES),
                        "handed_bytes": (1, MAX_POOL_BYTES), "length": (1, MAX_DATASET_LENGTH),
                        "num_distinct": (1, MAX_DISTINCT_SAMPLES), "num_classes": CLASSES, "seed": SEEDS}


@dataclass(frozen=True, kw_only=True)
class BadSamples(FileReading):
    """A format whose files may be missing or damaged."""

    # A missing or damaged file (each format's docstring says which): fail (one line naming the file,
    # before any job) or skip (left out, counted in the dataset's identity, said once a job).
    on_bad_sample: str = "fail"


@dataclass(frozen=True, kw_only=True)
class WebDataset(BadSamples):
    """WebDataset tar shards: a brace pattern, a path or a URL fsspec opens, or a list. Bad: a missing
    shard, a truncated tar (one without its end-of-archive marker too), a key with no image, a member
    over max_member_mb, a shard that is no regular file (a FIFO, a link to /dev/zero)."""

    _target_: str = "pipebench.datasets.webdataset_shards.WebDatasetShards"
    urls: Any
    # A sample is the members sharing a key: key.<image_ext> (an extension or a list) and key.<label_ext>
    # (an integer as text; null: no labels).
    image_ext: Any = "jpg"
    label_ext: Optional[str] = "cls"
    # Samples held and drawn at random as the shards stream past (webdataset's shuffle); 0: shard order.
    # No more than the largest set holds.
    shuffle_buffer: int = 0
    seed: int = 0
    # The largest tar member read, in MiB (1 to 65536): webdataset reads each member whole into memory.
    max_member_mb: int = 1024
    RANGES: ClassVar = {"shuffle_buffer": (0, MAX_DATASET_LENGTH), "seed": SEEDS}


@dataclass(frozen=True, kw_only=True)
class Parquet(BadSamples):
    """Parquet files of encoded images, the Hugging Face `datasets` layout: a path, a glob or a list.
    Bad: a missing file, a file without the named column."""

    _target_: str = "pipebench.datasets.parquet_rows.parquet_dataset"
    files: Any
    # HF's Image struct ({bytes, path}) or plain binary; the label an integer column (null: no labels).
    image_column: str = "image"
    label_column: Optional[str] = "label"
    # false: map-style, the sampler picks rows (read by row group); true: an IterableDataset whose shards
    # are the row groups, split across ranks and workers.
    streaming: bool = False


@dataclass(frozen=True, kw_only=True)
class LitData(FileReading):
    """LitData's optimized chunks, read with litdata.StreamingDataset. litdata reads its chunks itself,
    not through pipebench: `cache` and `storage` do nothing for it (each job says so)."""

    _target_: str = "pipebench.datasets.litdata_chunks.LitDataChunks"
    input_dir: str
    # Each item's fields: the encoded image (bytes), the integer label (null: no labels) and the sample's
    # index in the set, which the exactly-once check reads (convert writes all three).
    image_key: str = "image"
    label_key: Optional[str] = "label"
    index_key: Optional[str] = "index"
    # litdata's own shuffle of chunks and of items within them, with its seed.
    shuffle: bool = False
    seed: int = 0
    RANGES: ClassVar = {"seed": SEEDS}


@dataclass(frozen=True, kw_only=True)
class MDS(BadSamples):
    """Mosaic's MDS shards: the folder MDSWriter wrote, with its index.json, or a URL fsspec opens.
    Bad: a missing or truncated shard, one index.json names outside the folder, one with other columns
    or an unknown compression, a shard that is no regular file."""

    _target_: str = "pipebench.datasets.mds_shards.MDSShards"
    input_dir: str
    # The column holding the image (jpeg, png or bytes: handed to the chain undecoded; pil: raw pixels)
    # and the integer label column (int, int8..uint64 or str_int; null: no labels). MDS keeps no index:
    # a sample's index is its shard's offset plus its place in the shard.
    image_key: str = "image"
    label_key: Optional[str] = "label"


# Each catalogue group's config, by its name in conf/dataset/.
DATASET_GROUPS = {"synthetic_jpeg": SyntheticJpeg, "image_folder": ImageFolder, "random_tensors": RandomTensors,
                  "sharded_stream": ShardedStream, "storage_samples": StorageSamples, "webdataset": WebDataset,
                  "parquet": Parquet, "litdata": LitData, "mds": MDS}
