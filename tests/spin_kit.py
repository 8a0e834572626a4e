"""Work of known wall time for the attach tests: a spin to a wall-clock deadline, as a function and as
a transform. Importable as `spin_kit` (the tests folder is on sys.path; spawned workers get it too)."""

import time


def spin(ms: float) -> None:
    """Busy-wait until `ms` milliseconds of wall time have passed."""
    deadline = time.perf_counter() + ms / 1000
    while time.perf_counter() < deadline:
        pass


class Spin:
    """Spin `ms`, then return the input (a transform of known wall time)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, sample):
        spin(self.ms)
        return sample
