"""Lazily opened images of known decode cost, for the decode-line tests. Importable as
`decode_kit` (the tests folder is on sys.path)."""

import time
from pathlib import Path

from PIL import Image
from PIL.JpegImagePlugin import JpegImageFile
from torch.utils.data import Dataset

# A small picture: its real decode costs a few hundredths of a ms, far below the added cost.
SIDE = 48


class SlowJpeg(JpegImageFile):
    """A JPEG opened lazily whose decode spends `decode_ms` of this thread's CPU time first."""

    decode_ms = 0.0

    def load(self):
        if self.tile:
            deadline = time.thread_time_ns() + round(self.decode_ms * 1_000_000)
            while time.thread_time_ns() < deadline:
                pass
        return super().load()


class SlowDecodeDataset(Dataset):
    """`length` lazily opened copies of one JPEG whose decode costs `decode_ms` of CPU."""

    def __init__(self, folder: str, decode_ms: float, length: int = 256):
        self.path = Path(folder) / "picture.jpg"
        Image.new("RGB", (SIDE, SIDE), (200, 30, 90)).save(self.path)
        self.decode_ms = float(decode_ms)
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        image = SlowJpeg(str(self.path))
        image.decode_ms = self.decode_ms
        return image, index % 10
