"""Generated samples of a training workload's sizes, read from the emulated storage and no file.

The storage check's presets (pipebench storage-check, conf/storage_check/) stand for DLIO's
workloads: each sample is `sample_bytes` on storage (spread by `sample_bytes_stdev`, seeded per
index, as DLIO's `record_length_bytes_stdev`), and each read of it draws that many bytes from the
emulated storage (`dataset.storage.*`, the host's shared link among them), so the reads are what
the storage sees. What reaches the chain is, as DLIO hands its model a resized sample
(`record_length_bytes_resize`), a uint8 tensor of `handed_bytes` (the same for every sample, so the
default collate stacks them); with `images=true`, a lazily opened JPEG from a seeded corpus, so
an image chain (transform=imagenet) has something to decode.
"""

from __future__ import annotations

import io
from typing import Optional

import numpy as np
import torch
from torch.utils.data import Dataset

from pipebench.base.errors import DatasetError
from pipebench.config.limits import MAX_DATASET_LENGTH, MAX_DISTINCT_SAMPLES, MAX_POOL_BYTES, MAX_SEED
from pipebench.storage.dataset_contract import DatasetContract
from pipebench.storage.file_reads import FileReads

from .checks import require_int
from .lazy_image import rgb_from
from .synthetic_jpeg import draw_picture

NAME = "storage_samples"

# Independent seed streams: the sizes, the labels and the handed pool never shift one another.
_SIZE_STREAM, _LABEL_STREAM, _POOL_STREAM = 0, 1, 2
# images=true: an ImageNet-like picture (ImageNet's training images average about 400 x 350), at
# the quality the synthetic corpus uses; the decode is what the chain pays, the read is sample_bytes.
_IMAGE_WIDTH, _IMAGE_HEIGHT, _IMAGE_QUALITY = 500, 375, 90
# The smallest sample a spread may draw: a read of no bytes is no read.
_MIN_SAMPLE_BYTES = 1


class StorageSampleDataset(Dataset, DatasetContract):
    """`length` samples of a workload's sizes (module doc); `reads` is the emulated storage they
    are read from, which pipebench sets as `dataset.storage` says."""

    def __init__(self, sample_bytes: int, length: int = 10000, sample_bytes_stdev: int = 0,
                 handed_bytes: Optional[int] = None, images: bool = False, num_distinct: int = 8,
                 num_classes: int = 10, seed: int = 0) -> None:
        self.sample_bytes = require_int(NAME, "sample_bytes", sample_bytes, 1, MAX_POOL_BYTES)
        self.length = require_int(NAME, "length", length, 1, MAX_DATASET_LENGTH)
        self.sample_bytes_stdev = require_int(NAME, "sample_bytes_stdev", sample_bytes_stdev, 0, MAX_POOL_BYTES)
        handed = sample_bytes if handed_bytes is None else handed_bytes
        self.handed_bytes = require_int(NAME, "handed_bytes", handed, 1, MAX_POOL_BYTES)
        if not isinstance(images, bool):
            raise DatasetError(f"storage_samples: images must be true or false, got {images!r}")
        self.images = images
        self.num_distinct = require_int(NAME, "num_distinct", num_distinct, 1, MAX_DISTINCT_SAMPLES)
        self.num_classes = require_int(NAME, "num_classes", num_classes, 1, MAX_DATASET_LENGTH)
        self.seed = require_int(NAME, "seed", seed, 0, MAX_SEED)
        self.reads = FileReads()
        self._pool = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": None}  # each process builds its own pool on first use

    def _get_pool(self) -> list:
        """The handed samples: `num_distinct` JPEG files' bytes, or one buffer of random bytes."""
        if self._pool is None:
            rng = np.random.default_rng([self.seed, _POOL_STREAM])
            if self.images:
                self._pool = []
                for _ in range(self.num_distinct):
                    encoded = io.BytesIO()
                    draw_picture(rng, _IMAGE_WIDTH, _IMAGE_HEIGHT).save(encoded, "JPEG", quality=_IMAGE_QUALITY)
                    self._pool.append(encoded.getvalue())
            else:
                values = rng.integers(0, 256, size=self.handed_bytes + self.num_distinct, dtype=np.uint8)
                self._pool = [torch.from_numpy(values)]
        return self._pool

    def size_of(self, i: int) -> int:
        """Bytes sample `i` is on storage: drawn from its own seeded stream, so a dataset of millions
        of samples (the size rules want them) keeps no table of sizes."""
        i = range(self.length)[i]
        if not self.sample_bytes_stdev:
            return self.sample_bytes
        drawn = np.random.default_rng([self.seed, _SIZE_STREAM, i]).normal(self.sample_bytes, self.sample_bytes_stdev)
        return max(int(round(drawn)), _MIN_SAMPLE_BYTES)

    def label_of(self, i: int) -> int:
        return int(np.random.default_rng([self.seed, _LABEL_STREAM, i]).integers(0, self.num_classes))

    def total_bytes(self) -> int:
        """The dataset's size on storage (the samples' mean size a sample), for the size rule."""
        return self.length * self.sample_bytes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        i = range(self.length)[i]
        self.reads.draw(self.size_of(i))
        pool = self._get_pool()
        if self.images:
            return rgb_from(io.BytesIO(pool[i % self.num_distinct])), self.label_of(i)
        offset = i % self.num_distinct
        return pool[0][offset:offset + self.handed_bytes].clone(), self.label_of(i)

    def describe(self, i: int) -> str:
        i = range(self.length)[i]
        return f"generated sample {i} ({self.size_of(i)} bytes on storage)"

    def identity(self) -> dict:
        return {"name": "storage_samples", "sample_bytes": self.sample_bytes,
                "sample_bytes_stdev": self.sample_bytes_stdev, "handed_bytes": self.handed_bytes,
                "images": self.images, "length": self.length, "num_distinct": self.num_distinct,
                "num_classes": self.num_classes, "seed": self.seed}
