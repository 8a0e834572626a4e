"""JPEG decoders that replace PIL + PILToTensor: torchvision.io.decode_jpeg on the file's bytes.

`DecodeJpeg` decodes one lazily opened JPEG (libjpeg-turbo, straight to a uint8 [3, H, W]
tensor) on the CPU. The CUDA pair splits the same work at the host-to-device copy:
`ReadJpegBytes` reads the file's bytes in the worker (the collate keeps a list of them), and
`BatchDecodeJpeg` decodes the whole list on the GPU in one call (nvJPEG), after the copy.
An image that is not a JPEG file (a PNG, or one PIL already decoded and converted) is read
the way PILToTensor reads it, so the decoder never fails where the chain it replaces works.
"""

import io
import warnings
from typing import Any, List, Sequence, Union

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.functional import pil_to_tensor

from pipebench.pipeline.movement import PIL_ONLY, TENSOR, Movement

# PIL's name for a JPEG file, as `Image.format` reports it.
PIL_JPEG_FORMAT = "JPEG"
# torchvision 0.29 deprecates its image decoders in favour of TorchCodec and warns on every call;
# the decoder is what this move measures, so the warning is silenced around the call alone.
DEPRECATION_TEXT = "The image decoding and encoding capabilities of TorchVision are deprecated"


def decode_rgb(data: Any, device: str = "cpu") -> Any:
    """torchvision.io.decode_jpeg to RGB, without its deprecation warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=DEPRECATION_TEXT, category=DeprecationWarning)
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)


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
    return read_jpeg_bytes(path) if path else None


def read_jpeg_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class DecodeJpeg:
    """Decode a lazily opened JPEG with torchvision.io.decode_jpeg: uint8 [3, H, W], as PILToTensor
    gives after PIL's own decode (pixels may differ by a grey level or two between decoders)."""

    # Not pointwise: it reads the file, so a crop moved ahead of it would make it decode with PIL.
    movement = Movement(accepts=PIL_ONLY, returns=TENSOR)
    # The timed chain leaves the lazily opened image undecoded for it (pipebench.pipeline.timed_chain).
    decodes_itself = True

    def __call__(self, img: Image.Image) -> torch.Tensor:
        data = jpeg_bytes(img)
        if data is None:
            return pil_to_tensor(img)
        return decode_rgb(_as_tensor(data))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class BatchDecodeJpeg:
    """Decode a list of JPEG byte strings (the collate of ReadJpegBytes) in one decode_jpeg call on
    `device` (CUDA: nvJPEG's batched decode); returns a list of uint8 [3, H, W] tensors there."""

    movement = Movement(accepts=PIL_ONLY, returns=TENSOR)

    def __init__(self, device: str = "cuda"):
        self.device = device

    def __call__(self, batch: Sequence[Any]) -> List[torch.Tensor]:
        jpegs = [_as_tensor(item) for item in batch if isinstance(item, (bytes, bytearray))]
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
