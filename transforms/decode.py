"""JPEG decoders that replace PIL + PILToTensor: TorchCodec's decode_jpeg on the file's bytes, or
torchvision.io.decode_jpeg where TorchCodec cannot run.

`DecodeJpeg` decodes one lazily opened JPEG (libjpeg-turbo, straight to a uint8 [3, H, W] tensor)
on the CPU. The CUDA pair splits the same work at the host-to-device copy: `ReadJpegBytes` reads
the file's bytes in the worker (the collate keeps a list of them), and `BatchDecodeJpeg` decodes
the whole list on the GPU in one call (nvJPEG), after the copy. An image that is not a JPEG file
(a PNG, or one PIL already decoded and converted) is read the way PILToTensor reads it, so the
decoder never fails where the chain it replaces works.

torchvision 0.29 deprecates its image decoders in favour of TorchCodec (the `codec` extra), whose
image decoders need no FFmpeg. Each decode goes to TorchCodec where it loads and decodes on that
device in this process, else to torchvision's decoder; `decoder_note` says which, and why.
TorchCodec turns an image upright by its EXIF orientation, which neither PIL's lazily opened image
nor torchvision's decoder does: the turn is undone, so both give the pixels the file stores, as the
chain they replace does.
"""

import functools
import importlib
import importlib.metadata
import importlib.util
import io
import pathlib
import warnings
from typing import Any, Callable, Dict, List, Sequence, Union

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.functional import pil_to_tensor

from pipebench.base.extras import install_line
from pipebench.pipeline.movement import PIL_ONLY, TENSOR, Movement

# PIL's name for a JPEG file, as `Image.format` reports it.
PIL_JPEG_FORMAT = "JPEG"
CPU = "cpu"
# torchvision 0.29's deprecation warning, raised on every call of its decoders.
DEPRECATION_TEXT = "The image decoding and encoding capabilities of TorchVision are deprecated"
# TorchCodec's image decoders (FFmpeg-free), and pipebench's extra that installs it (the fallback's
# note names it in a pip line of this install's form).
TORCHCODEC = "torchcodec"
TORCHCODEC_DECODERS = "torchcodec.decoders"
CODEC_EXTRA = "codec"
# What the notes call each decoder.
TORCHCODEC_NAME = "TorchCodec's decode_jpeg"
TORCHVISION_NAME = "torchvision's decode_jpeg (deprecated since torchvision 0.29)"
# JPEG markers: each header segment starts with 0xFF and its marker (0xFF alone pads); APP1 may hold
# the EXIF block (its payload starts with EXIF_HEADER); SOS starts the entropy-coded scan, after every
# header segment. SOI, the first two bytes, has no length.
MARKER_PREFIX = 0xFF
APP1 = 0xE1
SOS = 0xDA
SOI_LENGTH = 2
EXIF_HEADER = b"Exif\x00\x00"
# EXIF's orientation tag (1: stored upright).
ORIENTATION_TAG = 0x0112
UPRIGHT = 1
# The turn that undoes each EXIF orientation on a [C, H, W] tensor: TorchCodec applies the one PIL's
# ImageOps.exif_transpose applies (mirror, flip, transpose, transverse: their own inverses; 6 and 8
# rotate a quarter turn, undone by the opposite one).
UNDO_ORIENTATION: Dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    2: lambda t: t.flip(-1),
    3: lambda t: t.flip(-2, -1),
    4: lambda t: t.flip(-2),
    5: lambda t: t.transpose(-2, -1),
    6: lambda t: t.rot90(1, (-2, -1)),
    7: lambda t: t.flip(-2, -1).transpose(-2, -1),
    8: lambda t: t.rot90(-1, (-2, -1)),
}
# The probe's picture: small, 4:2:0 (what photos are), a few 8x8 blocks.
PROBE_SIZE = (32, 24)

JpegData = Union[bytes, bytearray, torch.Tensor]


def _probe_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise(PROBE_SIZE, 60).convert("RGB").save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@functools.lru_cache(maxsize=None)
def torchcodec_problem(device: str = CPU) -> str:
    """Why TorchCodec's decode_jpeg cannot decode on `device` here ("" when it can): not installed, or
    it fails to load or to decode a small JPEG (its libraries need torch 2.11 or later and the CUDA
    runtime its wheel was built for; a CUDA decode needs a GPU). Asked once a process and device."""
    if importlib.util.find_spec(TORCHCODEC) is None:
        return f"TorchCodec is not installed ({install_line([CODEC_EXTRA])})"
    on = f"on {device} " if device != CPU else ""
    try:
        decoded = importlib.import_module(TORCHCODEC_DECODERS).decode_jpeg([_probe_jpeg()], device=device)[0]
    except Exception as exc:  # a library that does not load here fails in any way; the note says how
        version = importlib.metadata.version(TORCHCODEC)
        return f"TorchCodec {version} fails {on}here: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    if tuple(decoded.shape) != (3, PROBE_SIZE[1], PROBE_SIZE[0]):
        return f"TorchCodec decodes a {PROBE_SIZE[0]}x{PROBE_SIZE[1]} JPEG {on}to shape {tuple(decoded.shape)}"
    return ""


def decoder_note(device: str = CPU) -> str:
    """Which decode_jpeg decodes on `device` in this process: TorchCodec's, or torchvision's and why."""
    problem = torchcodec_problem(device)
    return f"{TORCHVISION_NAME}, as {problem}" if problem else TORCHCODEC_NAME


def _has_exif(data: bytes) -> bool:
    """Whether the JPEG's header segments hold an EXIF block: read segment by segment up to the scan
    (a few µs), since opening every file with PIL to ask would cost ~0.1 ms, and searching the bytes
    for EXIF_HEADER ~0.4 ms on a 130 kB file (measured here)."""
    at = SOI_LENGTH
    while at + 4 <= len(data) and data[at] == MARKER_PREFIX:
        marker = data[at + 1]
        if marker == MARKER_PREFIX:
            at += 1
            continue
        if marker == SOS:
            return False
        if marker == APP1 and data[at + 4:at + 4 + len(EXIF_HEADER)] == EXIF_HEADER:
            return True
        at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return False


def exif_orientation(data: JpegData) -> int:
    """The JPEG's EXIF orientation (UPRIGHT without an EXIF block), read by PIL."""
    raw = data.numpy().tobytes() if isinstance(data, torch.Tensor) else bytes(data)
    if not _has_exif(raw):
        return UPRIGHT
    return int(Image.open(io.BytesIO(raw)).getexif().get(ORIENTATION_TAG, UPRIGHT))


def torchcodec_rgb(data: Sequence[JpegData], device: str = CPU) -> List[torch.Tensor]:
    """TorchCodec's decode_jpeg to RGB, in one call (nvJPEG's batched decode on CUDA), each image
    turned back to the orientation its file stores."""
    codec = importlib.import_module(TORCHCODEC_DECODERS)  # optional: loaded where a decode runs
    decoded = codec.decode_jpeg(list(data), mode="RGB", device=device)
    return [UNDO_ORIENTATION[o](t) if (o := exif_orientation(d)) in UNDO_ORIENTATION else t
            for t, d in zip(decoded, data)]


def torchvision_rgb(data: Sequence[JpegData], device: str = CPU) -> List[torch.Tensor]:
    """torchvision.io.decode_jpeg to RGB, the fallback where TorchCodec cannot run."""
    with warnings.catch_warnings():
        # It warns on every call that it is deprecated in favour of TorchCodec: here it runs only
        # because TorchCodec cannot, which decoder_note says once, so the warning would be noise.
        warnings.filterwarnings("ignore", message=DEPRECATION_TEXT, category=DeprecationWarning)
        tensors = [d if isinstance(d, torch.Tensor) else torch.frombuffer(bytearray(d), dtype=torch.uint8)
                   for d in data]
        return list(decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device))


def decode_rgb(data: Union[JpegData, Sequence[JpegData]], device: str = CPU) -> Any:
    """JPEG bytes (or a list of them) decoded to RGB uint8 [3, H, W] on `device` (a list for a list):
    TorchCodec where it runs here, else torchvision's decoder."""
    many = isinstance(data, (list, tuple))
    items = list(data) if many else [data]
    decode = torchvision_rgb if torchcodec_problem(device) else torchcodec_rgb
    decoded = decode(items, device)
    return decoded if many else decoded[0]


def jpeg_bytes(img: Any) -> Union[bytes, None]:
    """The JPEG file behind a lazily opened image, or None (not a JPEG, or already decoded).

    A dataset that reads files through FileReads opens the image from the bytes it read (the load
    step holds the I/O), so those bytes are reused; an image opened from a path is read again.
    """
    if getattr(img, "format", None) != PIL_JPEG_FORMAT:
        return None
    source = getattr(img, "fp", None)
    if isinstance(source, io.BytesIO):
        return source.getvalue()
    path = getattr(img, "filename", None)
    return pathlib.Path(path).read_bytes() if path else None


class DecodeJpeg:
    """Decode a lazily opened JPEG with decode_rgb (TorchCodec's decode_jpeg, else torchvision's):
    uint8 [3, H, W], as PILToTensor gives after PIL's own decode (pixels may differ by a grey level
    or two between decoders)."""

    # Not pointwise: it reads the file, so a crop moved ahead of it would make it decode with PIL.
    movement = Movement(accepts=PIL_ONLY, returns=TENSOR)
    # The timed chain leaves the lazily opened image undecoded for it (pipebench.pipeline.timed_chain).
    decodes_itself = True

    def __call__(self, img: Image.Image) -> torch.Tensor:
        data = jpeg_bytes(img)
        if data is None:
            return pil_to_tensor(img)
        return decode_rgb(data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class BatchDecodeJpeg:
    """Decode a list of JPEG byte strings (the collate of ReadJpegBytes) in one decode_rgb call on
    `device` (CUDA: nvJPEG's batched decode, TorchCodec's else torchvision's); returns a list of
    uint8 [3, H, W] tensors there."""

    movement = Movement(accepts=PIL_ONLY, returns=TENSOR)

    def __init__(self, device: str = "cuda"):
        self.device = device

    def __call__(self, batch: Sequence[Any]) -> List[torch.Tensor]:
        jpegs = [item for item in batch if isinstance(item, (bytes, bytearray))]
        if len(jpegs) != len(batch):
            raise ValueError(f"{type(self).__name__}: expected a list of JPEG byte strings, got "
                             f"{type(batch[0]).__name__ if len(batch) else 'nothing'}")
        return list(decode_rgb(jpegs, self.device))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device!r})"


class ReadJpegBytes:
    """The worker's half of the GPU decode: the JPEG file's bytes (collated into a list, as
    default_collate keeps byte strings), for BatchDecodeJpeg after the copy."""

    movement = Movement(accepts=PIL_ONLY)
    # It only needs the file, so the timed chain leaves the image undecoded for it.
    decodes_itself = True

    def __call__(self, img: Image.Image) -> bytes:
        data = jpeg_bytes(img)
        if data is None:
            raise ValueError(f"{type(self).__name__}: the GPU decoder needs a JPEG file, got a "
                             f"{getattr(img, 'format', None) or type(img).__name__} image")
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
