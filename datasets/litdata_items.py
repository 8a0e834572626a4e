"""litdata's StreamingDataset as `dataset=litdata` reads it: each item with its position in the set, and
the serializers of encoded images handing back the file's bytes.

litdata's own `jpeg` and `image` deserializers decode to a tensor; the ones here return the bytes they
were given, so the chain gets the encoded image and its decode stays a timed step. Every other field
goes through litdata's own deserializer (`pil`: raw pixels back to a decoded PIL image). Imported only
once litdata is known to be installed (datasets/litdata_chunks.py).
"""

from __future__ import annotations

from typing import Any, Tuple

from litdata import StreamingDataset
from litdata.streaming.sampler import ChunkedIndex
from litdata.streaming.serializers import ImageSerializer, JPEGSerializer

__all__ = ["PositionedStream", "undecoded_serializers"]


class UndecodedJpeg(JPEGSerializer):
    """litdata's `jpeg` serializer, read back as the JPEG file's bytes."""

    def deserialize(self, data: bytes) -> bytes:
        return bytes(data)


class UndecodedImage(ImageSerializer):
    """litdata's `image:<ext>` serializer, read back as the encoded file's bytes."""

    def deserialize(self, data: bytes) -> bytes:
        return bytes(data)


def undecoded_serializers() -> dict:
    """The serializers StreamingDataset takes in place of its own, keyed as litdata keys them (a field
    written as `image:jpg` is read by `image`)."""
    return {"jpeg": UndecodedJpeg(), "image": UndecodedImage()}


class PositionedStream(StreamingDataset):
    """litdata's StreamingDataset, each item yielded as `(position in the set, item)`: the global index
    litdata's own sampler picked, whichever rank, worker or shuffle read it."""

    def __getitem__(self, index: Any) -> Tuple[int, Any]:
        item = super().__getitem__(index)
        return int(index.index if isinstance(index, ChunkedIndex) else index), item
