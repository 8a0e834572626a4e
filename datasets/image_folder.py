"""A folder of the user's own images, so a benchmark can run on the data the user
actually trains on."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from pipebench.base.errors import DatasetError
from pipebench.storage.dataset_contract import DatasetContract
from pipebench.storage.file_reads import FileReads

from .checks import require_int
from .folder_walk import walk_images
from .lazy_image import IMAGE_EXTENSIONS, open_rgb


class ImageFolderDataset(Dataset, DatasetContract):
    """Every image under `path` (recursive, sorted), opened lazily as RGB. Links are followed, each
    real folder once; loops and entries that are no image file are skipped, said in `notes()` and
    counted in `identity()` (datasets/folder_walk.py).

    Labels: when every image sits inside a first-level subfolder, the label is the index
    of that subfolder among the sorted subfolders that hold images, as torchvision's
    ImageFolder does, and `num_classes` becomes their count. Otherwise labels are
    seeded random integers in [0, num_classes).
    """

    def __init__(self, path: str | os.PathLike, num_classes: int = 10, seed: int = 0):
        require_int("image_folder", "num_classes", num_classes, 1)
        require_int("image_folder", "seed", seed, 0)
        root = Path(path).expanduser()
        if not root.exists():
            raise DatasetError(f"image_folder: {root} does not exist")
        if not root.is_dir():
            raise DatasetError(f"image_folder: {root} is not a directory")
        walk = walk_images(root)
        relative = list(walk.images)
        skipped = walk.skipped_line()
        if not relative:
            extensions = ", ".join(sorted(IMAGE_EXTENSIONS))
            also = f"; {skipped}" if skipped else ""
            raise DatasetError(f"image_folder: {root} holds no images (looked for {extensions}){also}")

        self.root = root.resolve()
        self.seed = seed
        self.skipped = walk.skipped_counts()
        self._note = f"image_folder: {root}: {skipped}" if skipped else None
        self._relative = relative
        top_folders = [p.split("/", 1)[0] if "/" in p else None for p in relative]
        if None in top_folders:
            self.classes = None
            self.num_classes = num_classes
            self._labels = np.random.default_rng(seed).integers(0, num_classes, size=len(relative))
        else:
            self.classes = sorted(set(top_folders))
            index = {name: k for k, name in enumerate(self.classes)}
            self.num_classes = len(self.classes)
            self._labels = np.array([index[name] for name in top_folders])
        self.reads = FileReads()

    def __len__(self) -> int:
        return len(self._relative)

    def __getitem__(self, i: int):
        return open_rgb(self.describe(i), self.reads), int(self._labels[i])

    def describe(self, i: int) -> str:
        """The image file behind sample i."""
        return str(self.root / self._relative[i])

    def notes(self) -> tuple[str, ...]:
        """One line on what the walk skipped, if anything: each job prints it (not the build, which
        the sweep's preflight repeats)."""
        return (self._note,) if self._note else ()

    def files(self) -> list[str]:
        """Every file the dataset reads."""
        return [str(self.root / rel) for rel in self._relative]

    def identity(self) -> dict:
        """The folder, its labelling, what the walk skipped, and a digest of the sorted relative paths
        and sizes: cheap for big folders, and it changes when a file is added, removed, renamed or
        rewritten at another size."""
        digest = hashlib.sha256()
        for rel in self._relative:
            try:
                size = (self.root / rel).stat().st_size
            except OSError as exc:
                raise DatasetError(f"image_folder: cannot read {self.root / rel}: {exc.strerror or exc}") from exc
            digest.update(f"{rel}\t{size}\n".encode())
        return {
            "name": "image_folder",
            "path": str(self.root),
            "num_images": len(self._relative),
            "labels": "random" if self.classes is None else "folders",
            "num_classes": self.num_classes,
            "seed": self.seed,
            "content_digest": digest.hexdigest(),
            **({"skipped": self.skipped} if self.skipped else {}),
        }
