"""The dataset of known cost `test_attach_first_batch.py` watches, and the child that watches it in a fresh
interpreter. A module of its own, importing no torchvision: a spawned loader worker unpickles `Known`
and the fresh interpreter runs `keeping_summary`, and each imported the whole test module for them
(torchvision.transforms.v2 with it, about 1.5 s more than torch and pipebench alone). Importable as
`first_batch_kit` (the tests folder is on sys.path; spawned processes get it too)."""

import mmap
import time

import numpy as np
import torch
from spin_kit import Spin, spin
from torch.utils.data import DataLoader, Dataset

import pipebench

FIRST_FETCH_MS = 60.0
LOAD_MS = 1.0
STEP_MS = 1.5
PAYLOAD_MB = 4
BATCH = 4
# A loader's workers prefetch up to workers x prefetch_factor (2 x 2) batches ahead of its steps.
PREFETCH_BATCHES = 4
# Each watch takes its readings off the loop's thread, after the meters' start, so on a loaded host
# a reading can come batches after its mark: CI once read a whole-tree growth of 50.7 MiB for 80
# kept at 4 MiB a batch (7 batches off; not reproduced here beside two spinning processes). The
# two-loader test keeps the same 80 MiB in quarter-size samples over 4x the steps: a reading that
# many batches off moves its growth by 7 MiB, inside its slack. Both memory tests keep it so.
KEEP_STEPS, KEEP_MB = 80, 0.25


def own_pages(mb: float) -> mmap.mmap:
    """MB of memory that only this process holds: an anonymous map of its own, written through. A
    malloc'd buffer can land in free pages of the heap a forked worker inherited, still shared with its
    parent and its siblings: each such page adds about 0.8 of a page to the worker's PSS and spreads the
    rest over the others, which is PSS counting right, but not the known truth. In a 1.2 GiB xdist
    worker the keeping loader read 65-68 MiB for 80 and the lean one +10 (a full run, reruns off)."""
    pages = mmap.mmap(-1, int(mb * (1 << 20)))
    pages.write(b"\x01" * len(pages))
    return pages


class Steps:
    """A Compose-like recipe (its steps in a `transforms` list, called in turn), as torchvision's
    Compose keeps them, without torchvision's import in each process that unpickles it."""

    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, sample):
        for step in self.transforms:
            sample = step(sample)
        return sample


class Known(Dataset):
    """The first fetch of each process spins FIRST_FETCH_MS; every sample LOAD_MS outside its recipe."""

    def __init__(self, keep_mb: float = 0, length: int = 48) -> None:
        self.length = length
        self.transform = Steps([Spin(STEP_MS)])
        self.payload = np.ones(PAYLOAD_MB << 20, np.uint8)
        self.keep_mb = keep_mb
        self.kept = []
        self.fetched = False

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i):
        if not self.fetched:
            self.fetched = True
            spin(FIRST_FETCH_MS)
        spin(LOAD_MS)
        if self.keep_mb:
            self.kept.append(own_pages(self.keep_mb))
        return self.transform(torch.zeros(3)), i


def run(loader, epochs=1, steps=100, skip=2):
    """Watch `loader` for `epochs` with a 2 ms step; its result."""
    watched = pipebench.watch(loader, steps=steps, skip_steps=skip)
    for _ in range(epochs):
        for _ in watched:
            time.sleep(0.002)
    return watched.result()


def keeping_summary(answer) -> None:
    """Watch a loader whose workers keep KEEP_MB a sample; send its summary back on `answer`."""
    # The epoch outlasts the window and its prefetch, so the prefetch runs as far ahead at both readings.
    length = (KEEP_STEPS + 2 + 2 * PREFETCH_BATCHES) * BATCH
    loader = DataLoader(Known(keep_mb=KEEP_MB, length=length), batch_size=BATCH, num_workers=2,
                        persistent_workers=True, multiprocessing_context="fork")
    answer.send(dict(run(loader, steps=KEEP_STEPS, skip=2).record.summary.row))
