"""The decode floor per core on the default corpus: PIL, TorchCodec's and torchvision's decode_jpeg, and
nvImageCodec's region decode of a 224 and a 256 box, side by side in one run.

Each decoder reads the same JPEG bytes (the default corpus: the synthetic 533x800 quality-90 photos),
on one thread, interleaved round by round so drift on a shared machine hits all alike. Per decode it
prints the median ms over the rounds and the megapixels a second of the image it stands in for
(533x800 = 0.43 MP: what a chain gets out of one decode, whole image or its crop). The full decodes
are followed by the crop a chain would take (free: a view); the region decodes decode only the box.
The two decode_jpeg rows go through pipebench.transforms.decode as the `decoder` move calls them
(TorchCodec's with its EXIF check, torchvision's deprecated one with its warning filtered); without
TorchCodec its row is left out, and a line says why.

    python benchmarks/decode_floor.py               # 7 rounds of 200 decodes each
    python benchmarks/decode_floor.py --rounds 3 --decodes 100
"""

import argparse
import io
import statistics
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from PIL import Image

from pipebench.datasets.synthetic_jpeg import SyntheticJpegDataset
from pipebench.transforms.decode import jpeg_bytes, torchcodec_problem, torchcodec_rgb, torchvision_rgb
from pipebench.transforms.region_codec import RegionCodec, region_decode_problem

# Distinct images the decodes cycle over: enough that no single picture's content sets the figure.
IMAGES = 16
BOXES = (224, 256)
TORCHCODEC_ROW = "TorchCodec decode_jpeg + crop 256"


def _corpus() -> List[bytes]:
    dataset = SyntheticJpegDataset(length=IMAGES, num_images=IMAGES)
    return [jpeg_bytes(dataset[i][0]) for i in range(IMAGES)]


def _decoders(corpus: List[bytes]) -> Dict[str, Callable[[bytes, int], object]]:
    width, height = Image.open(io.BytesIO(corpus[0])).size
    codec = RegionCodec()
    decoders: Dict[str, Callable[[bytes, int], object]] = {
        "PIL decode + crop 256": lambda data, _: np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[:256, :256],
    }
    if not torchcodec_problem():
        decoders[TORCHCODEC_ROW] = lambda data, _: torchcodec_rgb([data])[0][:, :256, :256]
    decoders["torchvision decode_jpeg + crop 256"] = lambda data, _: torchvision_rgb([data])[0][:, :256, :256]
    for side in BOXES:
        top, left = (height - side) // 2, (width - side) // 2
        decoders[f"region decode {side}x{side}"] = \
            lambda data, _, t=top, l=left, s=side: codec.decode(data, t, l, s, s)
    return decoders


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--decodes", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    problem = region_decode_problem()
    if problem:
        raise SystemExit(f"decode_floor: {problem}")
    if torchcodec_problem():
        print(f"decode_floor: no {TORCHCODEC_ROW} row: {torchcodec_problem()}")
    corpus = _corpus()
    width, height = Image.open(io.BytesIO(corpus[0])).size
    decoders = _decoders(corpus)
    times: Dict[str, List[float]] = {name: [] for name in decoders}
    for name, decode in decoders.items():  # warm-up: libraries loaded, caches filled
        for data in corpus:
            decode(data, 0)
    for _ in range(args.rounds):
        for name, decode in decoders.items():
            start = time.process_time_ns()
            for k in range(args.decodes):
                decode(corpus[k % IMAGES], k)
            times[name].append((time.process_time_ns() - start) / args.decodes / 1e6)
    megapixels = width * height / 1e6
    print(f"{len(corpus)} JPEGs of {width}x{height} ({megapixels:.2f} MP), one thread, CPU time a decode, "
          f"median of {args.rounds} interleaved rounds x {args.decodes} decodes\n")
    print("| decode | ms | min ms | max ms | source MP/s | vs PIL |")
    print("|---|---:|---:|---:|---:|---:|")
    pil = statistics.median(times["PIL decode + crop 256"])
    for name, values in times.items():
        ms = statistics.median(values)
        print(f"| {name} | {ms:.3f} | {min(values):.3f} | {max(values):.3f} | {megapixels / ms * 1e3:.0f} | "
              f"{pil / ms:.2f}x |")


if __name__ == "__main__":
    main()
