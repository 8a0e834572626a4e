"""A watched loop on the GPU's own clock (pipebench.attach.watch_clock).

On any machine: a real DataLoader watched by LoaderWatch, its steps queueing made-up work on a
fake GPU (test_async_steps.FakeGpu: one stream, events that complete when the GPU reaches them),
so the truth is known exactly. On a CUDA machine only: the same claim with real events and
`torch.cuda._sleep` kernels, skipped cleanly elsewhere.
"""

import statistics
import time

import pytest
import torch
from test_async_steps import FakeGpu
from torch.utils.data import DataLoader, Dataset

from pipebench.attach.watch import LoaderWatch, WatchWindow
from pipebench.attach.watch_clock import GpuWatchClock, cuda_watch_clock
from pipebench.config.specs import SYNC_ASYNC, SYNC_PER_STEP

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

BATCH = 4
# 6 batches an epoch: a window of 12 steps after 1 warm-up step spans three epochs, each later
# epoch's first batch a measured step of the window's one pass (its restart).
EPOCH_SAMPLES = 6 * BATCH
WINDOW = WatchWindow(steps=12, skip_steps=1)
# The host's made-up costs a step: the wait in next() and the launch of the step's GPU work.
WAIT_MS = 5.0
LAUNCH_MS = 1.0


class FakeWaitDataset(Dataset):
    """Each sample moves the fake GPU's host clock on: a batch's wait in next() is WAIT_MS."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu

    def __len__(self) -> int:
        return EPOCH_SAMPLES

    def __getitem__(self, index: int) -> torch.Tensor:
        self.gpu.host += WAIT_MS / BATCH
        return torch.zeros(2)


def _watched_loop(gpu_ms: float, epochs: int = 3):
    """A loop whose step launches gpu_ms of work on the fake GPU and returns: (watch, fake GPU)."""
    gpu = FakeGpu()
    loader = DataLoader(FakeWaitDataset(gpu), batch_size=BATCH, num_workers=0)
    watch = LoaderWatch(loader, WINDOW, site="train.py:1", gpu_clock=lambda: GpuWatchClock(gpu.event))
    for _ in range(epochs):
        for _batch in watch.epoch(lambda: iter(loader)):
            gpu.queue(gpu_ms)
            gpu.host += LAUNCH_MS
    return watch, gpu


def test_a_data_bound_loop_is_charged_only_the_wait_the_gpu_had():
    # The GPU finishes a step's 2 ms while the host launches (1 ms) and waits (5 ms): it idles
    # 4 ms of the host's 5 ms wait. The host's clock would say 5 / 6; the GPU's says 4 / 6.
    watch, _ = _watched_loop(gpu_ms=2.0)
    passes = watch.passes
    steps = [s for p in passes for s in p.steps]
    assert len(passes) == 1 and passes[0].epochs == 3 and len(steps) == WINDOW.steps
    # Every step alike, an epoch's first included: each epoch's clock starts at its own call of
    # next(), so the step the last epoch left open (its ending next()) is not idle time of the next.
    assert all((s.gpu_idle_data_ns, s.gpu_idle_other_ns, s.gpu_busy_ns) == (4_000_000, 0, 2_000_000) for s in steps)
    summary = watch.figures()[0]
    assert summary["step_sync"] == SYNC_ASYNC
    assert summary["starvation_pct"] == pytest.approx(100.0 * 4 / 6)
    assert summary["starvation_other_pct"] == 0.0
    assert summary["samples_per_s"] == pytest.approx(1000.0 * BATCH / 6.0)


def test_an_asynchronous_gpu_bound_step_is_not_charged_with_waits_it_does_not_have():
    # The host needs 6 ms a step, the GPU 10 ms: the host runs ahead, its waits happen while the
    # GPU works, and the GPU never idles. Its events are read late, and the watch never made the
    # host wait for the GPU.
    watch, gpu = _watched_loop(gpu_ms=10.0)
    assert gpu.tail - gpu.host > 10.0  # steps still queued on the GPU when the loop ended
    summary = watch.figures()[0]
    assert watch.gpu_clock.ring.blocked_reads == 0
    assert summary["starvation_pct"] == 0.0
    assert summary["step_ms_median"] == pytest.approx(10.0)
    assert summary["samples_per_s"] == pytest.approx(1000.0 * BATCH / 10.0)


def test_a_step_the_loop_leaves_unfinished_is_dropped_and_the_clock_counts_only_closed_steps():
    gpu = FakeGpu()
    clock = GpuWatchClock(gpu.event)
    clock.boundary(False)  # outside the window: no event at all
    assert clock._origin is None
    for _ in range(3):
        clock.boundary(True)
        gpu.host += WAIT_MS
        clock.delivered()
        gpu.queue(2.0)
    clock.cut()  # the loop broke out after its third batch: that step never ended
    clock.boundary(True)
    gpu.host += WAIT_MS
    clock.delivered()
    gpu.queue(2.0)
    clock.boundary(False)
    splits = clock.splits()
    assert len(splits) == 3
    # The steps after the cut starts from its own call of next(): the unfinished step's 2 ms of GPU
    # work ran during its wait and is not in its span.
    assert [(s.idle_data_ms, s.busy_ms) for s in splits] == [(WAIT_MS, 2.0), (WAIT_MS - 2.0, 2.0), (WAIT_MS - 2.0, 2.0)]


def test_a_loop_off_cuda_keeps_the_hosts_clock():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("CUDA is started in this process")
    assert cuda_watch_clock() is None
    loader = DataLoader(list(range(40)), batch_size=2)
    watch = LoaderWatch(loader, WatchWindow(steps=10, skip_steps=1), site="train.py:1")
    for _ in watch.epoch(lambda: iter(loader)):
        pass
    assert watch.gpu_clock is None and watch.figures()[0]["step_sync"] == SYNC_PER_STEP


# The GPU-only test: a step of GPU_BOUND_MS of kernel against a wait of HOST_WAIT_MS, then the
# other way round.
GPU_BOUND_MS = 20.0
HOST_WAIT_MS = 10.0
SMALL_GPU_MS = 2.0
# Real clocks on a real GPU: the host's sleep overshoots and launches cost a little.
GPU_STARVATION_POINTS = 5.0


class SleepDataset(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(HOST_WAIT_MS / 1000)
        return torch.zeros(2)


def _cycles_per_ms() -> float:
    """torch.cuda._sleep's spin cycles a millisecond on this GPU (timed by events), read after a warm-up:
    an idle GPU's clock ramps up under load, so a cold reading made every later 20 ms sleep run
    17.5 ms on the H100 host. The test still takes each kernel's own event time as the truth."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    readings = []
    for _ in range(5):
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        readings.append(cycles / start.elapsed_time(end))
    return statistics.median(readings[1:])


def _timed_sleep(cycles: int, kernels: list) -> None:
    """Queue a spin of `cycles` between two events (no sync), its pair kept in `kernels`."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    kernels.append((start, end))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the fake-GPU tests above cover the bookkeeping")
def test_on_cuda_the_watched_loop_reads_starvation_from_the_gpus_timeline():
    cycles = _cycles_per_ms()  # starts CUDA before the window opens, as a script's model.cuda() does
    loader = DataLoader(SleepDataset(), batch_size=1, num_workers=0)
    figures, kernel_ms = {}, {}
    for gpu_ms in (GPU_BOUND_MS, SMALL_GPU_MS):
        watch = LoaderWatch(loader, WatchWindow(steps=30, skip_steps=3), site="train.py:1")
        kernels = []
        for _batch in watch.epoch(lambda: iter(loader)):
            _timed_sleep(int(gpu_ms * cycles), kernels)  # queued; the host goes straight on
            if watch.done:
                break
        figures[gpu_ms] = watch.figures()[0]
        torch.cuda.synchronize()
        kernel_ms[gpu_ms] = statistics.median(start.elapsed_time(end) for start, end in kernels)
        host = [s for p in watch.passes for s in p.steps]
        figures[gpu_ms]["host_starvation_pct"] = 100.0 * sum(s.wait_ns for s in host) / sum(s.step_ns for s in host)
    bound, starved = figures[GPU_BOUND_MS], figures[SMALL_GPU_MS]
    print(f"kernels: {kernel_ms}; steps: {bound['step_ms_median']:.2f} ms GPU-bound; starvation "
          f"{bound['starvation_pct']:.1f}% and {starved['starvation_pct']:.1f}%")
    assert bound["step_sync"] == starved["step_sync"] == SYNC_ASYNC
    # GPU-bound: the host's 10 ms waits all happen while the GPU runs ~20 ms kernels, whose own event
    # times are the truth (a GPU's clock under load is not the calibration's).
    assert kernel_ms[GPU_BOUND_MS] > 1.5 * HOST_WAIT_MS
    assert bound["host_starvation_pct"] > 90.0
    assert bound["starvation_pct"] < GPU_STARVATION_POINTS
    assert bound["step_ms_median"] == pytest.approx(kernel_ms[GPU_BOUND_MS], rel=0.1)
    # Data-bound: the GPU idles the wait less the ~2 ms it was still busy.
    truth = 100.0 * (HOST_WAIT_MS - kernel_ms[SMALL_GPU_MS]) / HOST_WAIT_MS
    assert starved["starvation_pct"] == pytest.approx(truth, abs=GPU_STARVATION_POINTS)
