"""Ready-made uint8 image tensors, for transform chains measured without any decode."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from pipebench.base.errors import DatasetError
from pipebench.config.limits import (
    MAX_DATASET_LENGTH,
    MAX_DISTINCT_SAMPLES,
    MAX_POOL_BYTES,
    MAX_SAMPLE_ELEMENTS,
    MAX_SEED,
)
from pipebench.storage.dataset_contract import DatasetContract

from .checks import require_int

NAME = "random_tensors"

# Independent seed streams, so that changing num_distinct never reshuffles the labels.
_POOL_STREAM = 0
_LABEL_STREAM = 1


class RandomTensorDataset(Dataset, DatasetContract):
    """`length` samples cycling over a seeded pool of `num_distinct` uint8 tensors of
    `shape`, with seeded random labels fixed per index.

    Each sample is a clone, so an in-place transform cannot corrupt the pool. The pool
    is not pickled: each process rebuilds it from the seed on first use, so sending the
    dataset to spawned workers costs nothing however big the pool is.
    """

    def __init__(
        self,
        shape: Sequence[int] = (3, 256, 256),
        length: int = 10000,
        num_distinct: int = 64,
        num_classes: int = 10,
        seed: int = 0,
    ):
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or not shape:
            raise DatasetError(f"random_tensors: shape must be a non-empty list of integers >= 1, got {shape!r}")
        for dim in shape:
            require_int(NAME, "every dimension of shape", dim, 1, MAX_SAMPLE_ELEMENTS)
        self.shape = tuple(shape)
        elements = math.prod(self.shape)
        if elements > MAX_SAMPLE_ELEMENTS:
            raise DatasetError(f"random_tensors: shape {list(self.shape)} holds {elements} elements a sample, "
                               f"more than {MAX_SAMPLE_ELEMENTS}")
        self.length = require_int(NAME, "length", length, 1, MAX_DATASET_LENGTH)
        self.num_distinct = require_int(NAME, "num_distinct", num_distinct, 1, MAX_DISTINCT_SAMPLES)
        if elements * self.num_distinct > MAX_POOL_BYTES:
            raise DatasetError(f"random_tensors: num_distinct={num_distinct} samples of shape {list(self.shape)} "
                               f"take {elements * self.num_distinct} bytes, more than {MAX_POOL_BYTES}")
        self.num_classes = require_int(NAME, "num_classes", num_classes, 1, MAX_DATASET_LENGTH)
        self.seed = require_int(NAME, "seed", seed, 0, MAX_SEED)
        self._labels = np.random.default_rng([seed, _LABEL_STREAM]).integers(0, num_classes, size=length)
        self._pool = None

    def _get_pool(self) -> torch.Tensor:
        """The pool of distinct tensors, built on first use in each process."""
        if self._pool is None:
            rng = np.random.default_rng([self.seed, _POOL_STREAM])
            values = rng.integers(0, 256, size=(self.num_distinct, *self.shape), dtype=np.uint8)
            self._pool = torch.from_numpy(values)
        return self._pool

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": None}

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        i = range(self.length)[i]
        return self._get_pool()[i % self.num_distinct].clone(), int(self._labels[i])

    def describe(self, i: int) -> str:
        """Which pool tensor sample i is."""
        i = range(self.length)[i]
        return f"random tensor {i % self.num_distinct} of {self.num_distinct} (sample {i})"

    def identity(self) -> dict:
        """Parameters plus a digest of the pool's bytes (builds the pool if needed)."""
        return {
            "name": "random_tensors",
            "shape": list(self.shape),
            "length": self.length,
            "num_distinct": self.num_distinct,
            "num_classes": self.num_classes,
            "seed": self.seed,
            "content_digest": hashlib.sha256(self._get_pool().numpy().tobytes()).hexdigest(),
        }
