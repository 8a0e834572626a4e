"""The reference workload, and the CPU reference: that workload run now and then in the threads that make batches.

The workload is the seed's per-sample chain on a fixed photo; the calibration
(pipebench.measure.calibration) times it once, before the jobs.

A busy host makes the same chain cost more thread CPU time (11% under one CPU hog, beside a 10%
threshold), which a calibration before the jobs cannot see: the jobs' own workers are part of the
load. So under `calibrate=true` the CPU reference runs the workload inside each worker between
batches (about REFERENCE_SHARE of its CPU), paying the same contention at the same moments, and
`compare` compares the chain's CPU a sample over the reference's: a dearer chain moves the
quotient, a busier host does not.
"""

import io
import time
from typing import Any, Callable, List, Sequence

import numpy as np
import torch
from PIL import Image

from pipebench.datasets.synthetic_jpeg import draw_picture

# Bump whenever the workload below changes: scores of different workloads do not compare.
WORKLOAD_VERSION = 1
# Bump whenever the CPU reference's round figure changes meaning (its workload, statistic or share):
# compare divides by it only between runs of one version. 1: the median of the runs at 2% of the
# workers' CPU; 2: their mean at 3%, which reads above the median where the runs fall in two modes.
REFERENCE_VERSION = 2
# The seed's photo (the default corpus, datasets/synthetic_jpeg.py): 533x800 RGB at JPEG quality 90, cropped to 256.
IMAGE_WIDTH = 533
IMAGE_HEIGHT = 800
JPEG_QUALITY = 90
CROP_SIZE = 256
MASK_RATIO = 0.25
# One probe for every 1 / REFERENCE_SHARE of a worker's CPU time in batches: 3% slows the loader
# by less than a round's own spread (3-5% here), and a round of 15 steps of 32 samples at 5 ms a
# sample (2.4 s of CPU) holds about 15 probes, whose mean moves about 4.5% round to round where
# 10 moved 5.8% (benchmarks/reference_noise.py); that noise goes straight into compare's quotient.
REFERENCE_SHARE = 0.03
# The photo's seed and the RNG seed of each probe, so every probe does the same work.
REFERENCE_SEED = 0


def synthetic_jpeg(seed: int) -> bytes:
    """The fixed test photo, drawn and encoded in memory (no dataset cache involved)."""
    buffer = io.BytesIO()
    draw_picture(np.random.default_rng(seed), IMAGE_WIDTH, IMAGE_HEIGHT).save(buffer, "JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def seed_chain() -> List[Callable[[Any], Any]]:
    """The seed's per-sample chain with the fast dilation; decode happens in PILToTensor."""
    # Imported here: a job without calibrate=true needs none of these for its reference.
    from torchvision.transforms import PILToTensor, RandomCrop

    from pipebench.transforms.color import ConvertColor, Scale
    from pipebench.transforms.mask import FastRandomMask
    return [PILToTensor(), RandomCrop(CROP_SIZE), FastRandomMask(MASK_RATIO), ConvertColor(), Scale()]


def run_workload(jpeg: bytes, chain: Sequence[Callable[[Any], Any]]) -> Any:
    """One sample of the workload: the photo opened, then the chain, which decodes it (PILToTensor)."""
    sample = Image.open(io.BytesIO(jpeg))
    for step in chain:
        sample = step(sample)
    return sample


class CpuReference:
    """Runs the workload once the thread has spent enough CPU on batches since the last run, and
    answers the run's thread CPU ns (0 when not due). Its inputs are made where it is built (the
    job process, before any worker starts), so no worker's first batch pays for drawing the photo;
    a worker's copy (fork or spawn) carries them and starts its count afresh."""

    def __init__(self) -> None:
        self._jpeg = synthetic_jpeg(REFERENCE_SEED)
        self._chain = seed_chain()
        self._spent_ns = 0
        self._due_ns = 0  # the first batch probes at once, which also learns what a probe costs

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_spent_ns": 0, "_due_ns": 0}

    def after_batch(self, batch_cpu_ns: int) -> int:
        """Count a batch's CPU ns; run the workload when due and answer its thread CPU ns, else 0."""
        self._spent_ns += int(batch_cpu_ns)
        if self._spent_ns < self._due_ns:
            return 0
        cost = self.probe()
        self._spent_ns = 0
        self._due_ns = int(cost / REFERENCE_SHARE)
        return cost

    def probe(self) -> int:
        """One sample of the workload, its thread CPU ns. Torch's global RNG is left as it was, so the
        user's random transforms draw what they would have drawn without it."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(REFERENCE_SEED)
            start = time.thread_time_ns()
            run_workload(self._jpeg, self._chain)
            return time.thread_time_ns() - start
