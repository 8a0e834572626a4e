"""A long recorded run, simulated: the real recorder (`attach.recorder.Recorder` and its
`LoaderRecorder`) driven step by step on a fake clock, with fake waits and fake per-transform
timings, its windows closing as in a run, and its memory read by tracemalloc. Importable as
`recorder_sim_kit` (the tests folder is on sys.path; benchmarks/recorder_check.py puts it there too).

What a week-long run holds, pressed into fewer steps: epochs of EPOCH_STEPS steps, a window every
`every_steps`, every batch's transform timings riding in as fresh arrays (the recorder keeps up to
KEPT_BATCHES of them a window), a 30 s start every STALL_EPOCH_EVERY-th epoch (an epoch-start
capture), a one-window stall now and then (a capture opened and ended), and from LATE_STALL_AT of
the run on, a step that turns slow for good: a stall that lasts to the end, its capture rewritten
every window. So every per-run and per-window thing the recorder holds is in use: the window's sums
and sketch, the run's sketch, the baseline, the captures' bookkeeping and the stall in progress.
"""

import gc
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Sequence

import numpy as np

from pipebench.attach.recorder import LoaderRecorder, RecordSettings, Recorder
from pipebench.pipeline.timed_chain import StepName

NS_PER_MS = 1_000_000
BATCH = 8
EPOCH_STEPS = 5_000
# A window every 1,000 steps: 1,000 windows in a million. A window costs ms of its own (a row
# written and fsynced, the process tree's storage counters read), most of the run's time at shorter
# windows; a window holds no more at 1,000 steps than at 100 (KEPT_BATCHES is reached either way).
EVERY_STEPS = 1_000
STEP_MS = 10
# The usual wait: log-normal around 0.14 ms, a loader that keeps up.
WAIT_LOG_MS, WAIT_SIGMA = -2.0, 0.5
# Every 4th epoch starts after 30 s: an epoch-start stall and its capture.
STALL_EPOCH_EVERY, STALL_EPOCH_MS = 4, 30_000
# One window in 7 waits 8 ms more a step: a starvation stall of one window.
SHORT_STALL_EVERY, STALL_MS = 7, 8
# From here on the chain's last step costs 3x and every step waits STALL_MS more, to the end.
LATE_STALL_AT = 0.2
SAMPLE_STEPS = (StepName("sample", "Decode"), StepName("sample", "Crop"))
BATCH_STEPS = (StepName("batch", "collate"),)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@dataclass(frozen=True)
class SimulatedRun:
    """Traced memory in bytes (tracemalloc's current, after a gc) as a window closed, by its last step."""

    steps: int
    traced: Dict[int, int]

    def at(self, step: int) -> int:
        """The reading at the first window closed at or after `step`."""
        return self.traced[min(s for s in self.traced if s >= step)]


def _batches(loader: LoaderRecorder, clock: FakeClock, first_step: int, waits_ns: np.ndarray, late_step: int,
             every_steps: int) -> Iterator[np.ndarray]:
    """One epoch's batches: each advances the clock by its wait and sends its timings first, as a
    worker's batch brings them (a fresh array, as it comes out of the pipe)."""
    batch = np.zeros(BATCH)
    usual = np.full((BATCH, len(SAMPLE_STEPS)), NS_PER_MS, np.int64)
    slow = usual.copy()
    slow[:, -1] *= 3
    cpu_ns = usual[:, 0]
    for n in range(len(waits_ns)):  # no list of the epoch's waits: the readings would count it
        wait = int(waits_ns[n])
        step = first_step + n
        late = step >= late_step
        if late or (step // every_steps) % SHORT_STALL_EVERY == SHORT_STALL_EVERY - 1:
            wait += STALL_MS * NS_PER_MS
        clock.now += wait
        loader.timings(((slow if late else usual).copy(), cpu_ns, NS_PER_MS, NS_PER_MS))
        yield batch


class _Readings:
    """A sink that reads tracemalloc as a window's row goes out, once at or past each step asked for."""

    def __init__(self, steps: Sequence[int]) -> None:
        self.pending = sorted(steps)
        self.traced: Dict[int, int] = {}

    def __call__(self, kind: str, row: Dict[str, Any]) -> None:
        last = row.get("last_step")
        if kind == "window" and self.pending and last >= self.pending[0]:
            gc.collect()  # what is left is held, not reference cycles awaiting the gc (json's encoder makes some)
            self.traced[last] = tracemalloc.get_traced_memory()[0]
            self.pending = [step for step in self.pending if step > last]

    def close(self) -> None:
        pass


def simulated_run(folder: Path, steps: int, readings: Sequence[int], every_steps: int = EVERY_STEPS,
                  seed: int = 0) -> SimulatedRun:
    """`steps` steps through a recorder writing into `folder`, tracemalloc on from before the
    recorder exists (the run is several times slower under it); traced memory read as the first
    window closes at or after each step of `readings`."""
    clock = FakeClock()
    rng = np.random.default_rng(seed)
    late_step = int(steps * LATE_STALL_AT)
    sink = _Readings(readings)
    tracemalloc.start()
    try:
        recorder = Recorder(folder, RecordSettings(every_steps=every_steps), sink=sink, clock=clock)
        loader = recorder.loader("loader=sim.py:1", SAMPLE_STEPS, BATCH_STEPS)
        epoch = 0
        while loader.step_number < steps:
            epoch += 1
            waits = (rng.lognormal(WAIT_LOG_MS, WAIT_SIGMA, min(EPOCH_STEPS, steps - loader.step_number))
                     * NS_PER_MS).astype(np.int64)
            if epoch % STALL_EPOCH_EVERY == 0:
                waits[0] = STALL_EPOCH_MS * NS_PER_MS
            for _ in loader.epoch(_batches(loader, clock, loader.step_number + 1, waits, late_step, every_steps),
                                  BATCH):
                clock.now += STEP_MS * NS_PER_MS
        recorder.close()
    finally:
        tracemalloc.stop()
    return SimulatedRun(loader.step_number, sink.traced)
