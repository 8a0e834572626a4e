"""A transform that misbehaves on cue, for the fault tests and benchmarks/fault_matrix.py.

`Fault` acts only in the job where `key == when` (a config gives `key: ${workers}`, so one job of a
sweep misbehaves and the others pass their samples through), and only while the file ARMED exists
in `marker_dir` (a test disarms it before resuming the sweep it interrupted). When it acts it first
writes a marker file named after its pid: a test waits for that event (this process is inside the
transform now) instead of sleeping for a guessed time, and knows whom to kill.

`ToArray`, which behaves, is the chain of runs that need only an image's pixels. The kit copies
this file into a user project, where `_target_: fault_transforms.Fault` finds it.
"""

import errno
import os
import time
from pathlib import Path

import numpy as np

# While this file exists in marker_dir, Fault acts.
ARMED = "armed"
# What Fault does: sleep (blocked in time.sleep), spin (a pure-Python busy loop), exit (the
# process ends without a Python error, as a worker the OOM killer took), pass (marker only), fill
# (fills the file system marker_dir is on, as a full disk, then passes its sample through).
ACTIONS = ("sleep", "spin", "exit", "pass", "fill")
# The file `fill` grows until the file system has no space left; deleting it frees the space.
FILLER = "filler"
# How much `fill` writes at a time.
FILL_CHUNK = 1 << 20
# One sleep longer than any test: only a kill or the watchdog ends it.
HANG_S = 3600.0


class Fault:
    def __init__(self, marker_dir: str, action: str, key=None, when=None) -> None:
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
        self.marker_dir = Path(marker_dir)
        self.action = action
        self.active = key == when

    def _armed(self) -> bool:
        return (self.marker_dir / ARMED).exists()

    def __call__(self, sample):
        if not (self.active and self._armed()):
            return sample
        (self.marker_dir / str(os.getpid())).touch()
        if self.action == "fill":
            fill(self.marker_dir / FILLER)
        if self.action == "exit":
            os._exit(3)
        if self.action == "sleep":
            time.sleep(HANG_S)
        while self.action == "spin":
            pass
        return sample


class ToArray:
    """An image's pixels as an array, which the loader's collate stacks into a tensor: a one-step chain
    with no torchvision to import (seconds in the job process), for the image-folder cases and
    test_peer_formats' LitData run."""

    def __call__(self, image):
        return np.asarray(image)


def fill(path: Path) -> None:
    """Grow `path` until its file system is full."""
    chunk = b"\0" * FILL_CHUNK
    try:
        with path.open("ab", buffering=0) as out:
            while True:
                out.write(chunk)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
