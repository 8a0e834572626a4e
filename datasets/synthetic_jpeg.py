"""A seeded corpus of photo-like JPEGs, the stand-in for the seed's one colourful
533x800 photo: a benchmark needs realistic decode cost without shipping images."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Tuple

import numpy as np
from PIL import Image, ImageDraw, ImageFilter
from torch.utils.data import Dataset

from pipebench.base.errors import DatasetError
from pipebench.base.typed_json import parse
from pipebench.config.limits import (
    MAX_DATASET_LENGTH,
    MAX_DISTINCT_SAMPLES,
    MAX_IMAGE_SIDE,
    MAX_SEED,
)
from pipebench.storage.dataset_contract import DatasetContract
from pipebench.storage.file_reads import FileReads

from .checks import require_int
from .lazy_image import open_rgb

NAME = "synthetic_jpeg"

# Bump whenever the picture generator changes, so caches built by older code are
# not reused under the same parameters.
GENERATOR_VERSION = 1

# Pillow's documentation advises against JPEG quality above 95: files grow with no
# visible gain and some encoder paths are disabled.
MAX_QUALITY = 95

# Independent seed streams, so that changing num_images never reshuffles the labels.
_IMAGE_STREAM = 0
_LABEL_STREAM = 1

# Picture recipe. Tuned on the project's 2-core machine so that a 533x800 image at
# quality 90 is ~125 KB and decodes like a real photo resized to that size (a
# 533x800 quality-90 version of matplotlib's grace_hopper.jpg decodes within 10%
# of it here).
_BACKGROUND_GRID = (2, 5)  # coarse colour grid, upsampled into smooth gradients
_NUM_SHAPES = 60  # translucent ellipses, rectangles and triangles
_SHAPE_RADIUS_FRACTION = (1 / 40, 1 / 3)  # of the short side, drawn log-uniformly
_SHAPE_ALPHA = (96, 256)  # translucent, so the gradients show through
_TEXTURE_CELL = 8  # pixels per cell of the blotchy texture
_TEXTURE_AMPLITUDE = 10.0  # grey levels
_GRAIN_SIGMA = 5.0  # grey levels of per-pixel luminance noise, like sensor grain

_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class _CachedFile:
    """One JPEG of the corpus, as the manifest lists it."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class _Manifest:
    """manifest.json: the parameters the corpus was drawn with, its files and a digest of their bytes."""

    params: Mapping[str, Any]
    files: Tuple[_CachedFile, ...]
    digest: str


def _default_cache_root() -> Path:
    """$XDG_CACHE_HOME/pipebench/synthetic_jpeg, or ~/.cache/... when unset (XDG spec:
    a relative value is ignored)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "pipebench" / "synthetic_jpeg"


def draw_picture(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """One colourful picture: smooth gradients, translucent shapes, texture and grain."""
    grid_h, grid_w = rng.integers(*_BACKGROUND_GRID, size=2)
    grid = rng.integers(0, 256, size=(grid_h, grid_w, 3), dtype=np.uint8)
    img = Image.fromarray(grid).resize((width, height), Image.Resampling.BICUBIC)

    draw = ImageDraw.Draw(img, "RGBA")
    short_side = min(width, height)
    log_radius = [math.log(short_side * f) for f in _SHAPE_RADIUS_FRACTION]
    for _ in range(_NUM_SHAPES):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = np.exp(rng.uniform(*log_radius, size=2))
        colour = tuple(int(v) for v in rng.integers(0, 256, size=3))
        fill = colour + (int(rng.integers(*_SHAPE_ALPHA)),)
        kind = rng.integers(3)
        if kind == 0:
            draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=fill)
        elif kind == 1:
            draw.rectangle([cx - rx, cy - ry, cx + rx, cy + ry], fill=fill)
        else:
            angles = rng.uniform(0, 2 * math.pi, size=3)
            draw.polygon([(cx + rx * math.cos(a), cy + ry * math.sin(a)) for a in angles], fill=fill)
    img = img.filter(ImageFilter.SMOOTH)  # soften the drawn edges, as a lens would

    cells = rng.integers(
        0, 256,
        size=(max(1, height // _TEXTURE_CELL), max(1, width // _TEXTURE_CELL)),
        dtype=np.uint8,
    )
    texture = Image.fromarray(cells).resize((width, height), Image.Resampling.BICUBIC)
    luminance = (np.asarray(texture, np.float32) - 128.0) * (_TEXTURE_AMPLITUDE / 64.0)
    luminance += rng.standard_normal((height, width), dtype=np.float32) * _GRAIN_SIGMA
    pixels = np.asarray(img, np.float32) + luminance[..., None]
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


class SyntheticJpegDataset(Dataset, DatasetContract):
    """`length` samples cycling over `num_images` distinct seeded JPEGs on disk, each
    opened lazily (see lazy_image), with seeded random labels fixed per index.

    The JPEGs are built once per parameter set into a cache folder and reused by every
    later run and process; `cache_dir` replaces the default cache root.
    """

    def __init__(
        self,
        length: int = 10000,
        num_images: int = 64,
        width: int = 533,
        height: int = 800,
        quality: int = 90,
        num_classes: int = 10,
        seed: int = 0,
        cache_dir: str | os.PathLike | None = None,
    ):
        self.length = require_int(NAME, "length", length, 1, MAX_DATASET_LENGTH)
        self.num_images = require_int(NAME, "num_images", num_images, 1, MAX_DISTINCT_SAMPLES)
        self.width = require_int(NAME, "width", width, 1, MAX_IMAGE_SIDE)
        self.height = require_int(NAME, "height", height, 1, MAX_IMAGE_SIDE)
        self.quality = require_int(NAME, "quality", quality, 1, MAX_QUALITY)
        self.num_classes = require_int(NAME, "num_classes", num_classes, 1, MAX_DATASET_LENGTH)
        self.seed = require_int(NAME, "seed", seed, 0, MAX_SEED)

        image_params = {
            "generator": GENERATOR_VERSION,
            "num_images": num_images,
            "width": width,
            "height": height,
            "quality": quality,
            "seed": seed,
        }
        digest = hashlib.sha256(json.dumps(image_params, sort_keys=True).encode()).hexdigest()
        root = Path(cache_dir).expanduser() if cache_dir is not None else _default_cache_root()
        self.cache_path = root / digest[:16]
        if not self.cache_path.exists():
            self._build(image_params)
        manifest = self._read_manifest()
        self._paths = [str(self.cache_path / entry.name) for entry in manifest.files]
        self._content_digest = manifest.digest
        rng = np.random.default_rng([seed, _LABEL_STREAM])
        self._labels = rng.integers(0, num_classes, size=length)
        self.reads = FileReads()

    def _build(self, image_params: dict) -> None:
        """Write the corpus into a temporary folder beside the cache, then rename it into
        place, so a reader never sees half a corpus. If another process renames first,
        its corpus (identical by construction) is kept and ours discarded."""
        root = self.cache_path.parent
        try:
            root.mkdir(parents=True, exist_ok=True)
            # Not tempfile.mkdtemp: its 0700 mode would survive the rename and hide a
            # shared cache from other users; mkdir honours the umask.
            tmp = root / f".{self.cache_path.name}.{uuid.uuid4().hex}.tmp"
            tmp.mkdir()
        except OSError as exc:
            raise DatasetError(f"synthetic_jpeg: cannot create cache folder {root}: {exc.strerror or exc}") from exc
        try:
            files = []
            whole = hashlib.sha256()
            for k in range(self.num_images):
                rng = np.random.default_rng([self.seed, _IMAGE_STREAM, k])
                buf = io.BytesIO()
                draw_picture(rng, self.width, self.height).save(buf, "JPEG", quality=self.quality)
                data = buf.getvalue()
                name = f"{k:05d}.jpg"
                (tmp / name).write_bytes(data)
                sha = hashlib.sha256(data).hexdigest()
                whole.update(sha.encode())
                files.append(_CachedFile(name, len(data), sha))
            manifest = _Manifest(image_params, tuple(files), whole.hexdigest())
            (tmp / _MANIFEST).write_text(json.dumps(asdict(manifest), indent=1))
            try:
                os.rename(tmp, self.cache_path)
            except OSError:
                if not (self.cache_path / _MANIFEST).exists():
                    raise
                # Another process won the race; its corpus is used below.
        except OSError as exc:
            raise DatasetError(f"synthetic_jpeg: cannot write cache {self.cache_path}: {exc.strerror or exc}") from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _read_manifest(self) -> _Manifest:
        """Read the manifest and check every file it lists is present at its size."""
        try:
            manifest = parse(_Manifest, json.loads((self.cache_path / _MANIFEST).read_text()))
            manifest = replace(manifest, files=tuple(parse(_CachedFile, e) for e in manifest.files))
            damaged = len(manifest.files) != self.num_images or any(
                (self.cache_path / e.name).stat().st_size != e.size for e in manifest.files
            )
        except (OSError, ValueError, KeyError, TypeError):
            damaged = True
        if damaged:
            raise DatasetError(
                f"synthetic_jpeg: cache {self.cache_path} is incomplete or modified; delete it to rebuild"
            )
        return manifest

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        i = range(self.length)[i]
        return open_rgb(self._paths[i % self.num_images], self.reads), int(self._labels[i])

    def describe(self, i: int) -> str:
        """The JPEG file behind sample i."""
        return self._paths[range(self.length)[i] % self.num_images]

    def files(self) -> list[str]:
        """Every distinct file the dataset reads (samples cycle over them)."""
        return list(self._paths)

    def identity(self) -> dict:
        """Parameters plus a digest of the JPEG bytes (computed at build time)."""
        params = ("length", "num_images", "width", "height", "quality", "num_classes", "seed")
        return {"name": NAME, **{key: getattr(self, key) for key in params}, "generator": GENERATOR_VERSION,
                "content_digest": self._content_digest}
