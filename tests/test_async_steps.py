"""The asynchronous step loop, tested through its logic on any machine: events read late, the bound
on steps in flight, and starvation from a GPU timeline of known truth (fake events on a made-up clock)."""

import dataclasses
import importlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import QUICK_RUN, TINY_DATASET, compose_spec
from known_cost_kit import known_cost

from pipebench.base.gpu_timeline import EventRing, GpuStepSplit, StepTimes, split_steps
from pipebench.base.gpu_timing import MAX_STEPS_IN_FLIGHT, AsyncStepClock
from pipebench.config.specs import SYNC_ASYNC, SYNC_PER_STEP
from pipebench.measure.job import measure_job
from pipebench.measure.reference import plain_loop, window_spec
from pipebench.measure.runner import StepLoop, measure_pass
from pipebench.measure.steps import TimingSink, pass_plan
from pipebench.measure.repeats import resolve_sync
from pipebench.measure.summarize import pass_records, summary_row
from pipebench.measure.window import split_window
from pipebench.record.jobs import JobResult
from pipebench.record.results import _check_row
from pipebench.base.typed_json import parse_all
from pipebench.record.sections import PassRecord
from pipebench.report.diagnosis import _consumer_ms
from pipebench.pipeline.consumers import EmulatedConsumer, NoConsumer, StepTimeDistribution, ToyCnnConsumer
from pipebench.pipeline.timed_chain import TimedBatch

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone


class FakeGpu:
    """One CUDA stream on a made-up clock (ms). `host` is the host's time; work queued runs after
    the stream's tail; an event completes when the GPU reaches it, and waiting moves the host on."""

    def __init__(self) -> None:
        self.host = 0.0
        self.tail = 0.0

    def event(self) -> "FakeEvent":
        return FakeEvent(self)

    def queue(self, ms: float) -> None:
        self.tail = max(self.tail, self.host) + ms

    def synchronize(self) -> None:
        self.host = max(self.host, self.tail)


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.time = None
        self.waited = False

    def record(self) -> None:
        self.time = max(self.gpu.host, self.gpu.tail)
        self.gpu.tail = self.time

    def query(self) -> bool:
        return self.time is not None and self.time <= self.gpu.host

    def synchronize(self) -> None:
        self.waited = True
        self.gpu.host = max(self.gpu.host, self.time)

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.query() and end.query(), "an event was read before the GPU reached it"
        return end.time - self.time


@dataclasses.dataclass
class Item:
    last: FakeEvent


def test_the_ring_reads_only_completed_steps_oldest_first_and_blocks_on_the_oldest_when_full():
    gpu = FakeGpu()
    ring = EventRing(2)
    items = []
    for _ in range(3):
        gpu.queue(10.0)
        event = gpu.event()
        event.record()
        items.append(Item(event))
    assert ring.push(items[0]) == [] and ring.push(items[1]) == []  # the GPU has not reached them
    read = ring.push(items[2])  # a third in flight: the host waits for the oldest
    assert read == [items[0]] and items[0].last.waited and not items[1].last.waited
    assert len(ring) == 2 and ring.peak_in_flight == 2 and ring.blocked_reads == 1
    gpu.host = items[1].last.time  # the GPU got through the second on its own
    later = Item(gpu.event())
    later.last.time = float("inf")
    assert ring.push(later) == [items[1]] and not items[1].last.waited
    with pytest.raises(ValueError):
        EventRing(0)


def test_split_steps_parts_each_gap_into_waiting_for_data_and_the_rest():
    steps = [
        # idle 0..6: the host waited 0..5 for data, then 1 ms of its own work before the copy
        StepTimes(0, wait_start=0.0, data_ready=5.0, first_kernel=6.0, copy_end=7.0, last_kernel_end=16.0),
        # the host began waiting at 12 while the GPU was busy (its event completed at 16): idle 16..20.5
        StepTimes(1, wait_start=16.0, data_ready=20.0, first_kernel=20.5, copy_end=21.0, last_kernel_end=30.0),
        # the host ran ahead: every event completed as the previous step ended, no idle at all
        StepTimes(2, wait_start=30.0, data_ready=30.0, first_kernel=30.0, copy_end=30.5, last_kernel_end=40.0),
        # host times that begin before the previous end count from that end only
        StepTimes(3, wait_start=35.0, data_ready=41.0, first_kernel=44.0, copy_end=44.0, last_kernel_end=45.0),
    ]
    assert split_steps(steps) == [
        GpuStepSplit(idle_data_ms=5.0, idle_other_ms=1.0, busy_ms=10.0, h2d_ms=1.0),
        GpuStepSplit(idle_data_ms=4.0, idle_other_ms=0.5, busy_ms=9.5, h2d_ms=0.5),
        GpuStepSplit(idle_data_ms=0.0, idle_other_ms=0.0, busy_ms=10.0, h2d_ms=0.5),
        GpuStepSplit(idle_data_ms=1.0, idle_other_ms=3.0, busy_ms=1.0, h2d_ms=0.0),
    ]
    assert sum(s.idle_data_ms + s.idle_other_ms + s.busy_ms for s in split_steps(steps, window_start=-2.0)) == 47.0


def _host_loop(clock: AsyncStepClock, gpu: FakeGpu, steps: int, wait_ms: float, busy_ms: float,
               overhead_ms: float = 0.0, copy_ms: float = 0.5, pushed=None) -> None:
    """What StepLoop.step does with a clock, on the fake GPU: the host's own work, the wait in
    next(loader), the copy and the step queued without waiting."""
    for _ in range(steps):
        gpu.host += overhead_ms
        clock.mark()
        gpu.host += wait_ms
        clock.mark()
        clock.mark()
        gpu.queue(copy_ms)
        clock.mark()
        gpu.queue(busy_ms)
        clock.mark()
        clock.end_step()
        if pushed is not None:
            pushed.append((len(clock._times), gpu.host))


def _clock(gpu: FakeGpu) -> AsyncStepClock:
    return AsyncStepClock(new_event=gpu.event, synchronize=gpu.synchronize)


def test_a_data_bound_loop_reads_its_steps_late_and_the_gpu_idles_waiting_for_data():
    gpu = FakeGpu()
    clock = _clock(gpu)
    _host_loop(clock, gpu, 2, wait_ms=10.0, busy_ms=3.5)  # warm-up: dropped
    clock.begin_window()
    pushed = []
    _host_loop(clock, gpu, 6, wait_ms=10.0, busy_ms=3.5, pushed=pushed)
    # Step i's events are read at step i+1 at the earliest (the GPU was still running it).
    assert [read for read, _ in pushed] == list(range(6))
    assert clock.ring.blocked_reads == 0  # the GPU always caught up: the host never waited on it
    splits = split_steps(clock.end_window())
    assert len(splits) == 6
    assert splits[0] == GpuStepSplit(10.0, 0.0, 4.0, 0.5)  # the window starts idle
    assert all(s == GpuStepSplit(6.0, 0.0, 4.0, 0.5) for s in splits[1:])


def test_a_gpu_bound_loop_runs_ahead_by_at_most_the_bound_and_the_gpu_never_idles():
    gpu = FakeGpu()
    clock = _clock(gpu)
    clock.begin_window()
    _host_loop(clock, gpu, 12, wait_ms=1.0, busy_ms=9.5)
    assert clock.ring.peak_in_flight == MAX_STEPS_IN_FLIGHT
    assert clock.ring.blocked_reads > 0  # the host waited for the oldest step, never for every step
    assert gpu.tail - gpu.host > 9.5  # the host left the loop with steps still queued on the GPU
    splits = split_steps(clock.end_window())
    assert splits[0].idle_data_ms == 1.0 and all(s.idle_data_ms == s.idle_other_ms == 0 for s in splits[1:])
    assert all(s.busy_ms == 10.0 for s in splits)


def test_the_main_loops_own_work_is_idle_other_only_where_the_gpu_has_nothing_left_to_run():
    gpu = FakeGpu()
    clock = _clock(gpu)
    clock.begin_window()
    _host_loop(clock, gpu, 4, wait_ms=10.0, busy_ms=1.5, overhead_ms=2.0)  # hidden behind 2 ms of GPU work
    hidden = split_steps(clock.end_window())
    assert all(s.idle_other_ms == 0 for s in hidden[1:])
    clock.begin_window()
    _host_loop(clock, gpu, 4, wait_ms=10.0, busy_ms=3.5, overhead_ms=6.0)  # 2 ms past the GPU's 4
    seen = split_steps(clock.end_window())
    assert all(s == GpuStepSplit(10.0, 2.0, 4.0, 0.5) for s in seen[1:])


class QueueingConsumer:
    """Queues `busy_ms` of work on the fake GPU and returns at once, as a consumer running ahead."""

    device = torch.device("cpu")

    def __init__(self, gpu: FakeGpu, busy_ms: float) -> None:
        self.gpu = gpu
        self.busy_ms = busy_ms

    def step(self, data, labels) -> None:
        self.gpu.queue(self.busy_ms)


class FakeStream:
    """Batches after `wait_ms` of (made-up) waiting, as BatchStream hands them over."""

    in_process = False
    epochs = 1
    worker_startup_s: dict = {}

    def __init__(self, gpu: FakeGpu, wait_ms: float) -> None:
        self.gpu = gpu
        self.wait_ms = wait_ms

    def next(self) -> TimedBatch:
        self.gpu.host += self.wait_ms
        return TimedBatch(torch.zeros(4, 3), torch.zeros(4), np.ones((4, 1), np.int64), np.ones(1, np.int64),
                          np.ones((4, 1), np.int64), 1, (), 0, 0, 0)


def test_an_async_pass_reports_starvation_and_accel_util_from_the_gpu_timeline():
    """A batch every 3 ms, 1 ms of GPU work a step: the GPU idles 2 ms of every 3 waiting for data
    (3 ms before the window's first step), whatever the host's own clocks say."""
    gpu = FakeGpu()
    spec = compose_spec([*TINY_DATASET, "workers=0", "run.steps=8", "run.min_time_s=0", "run.progress=false"])
    loop = StepLoop(FakeStream(gpu, wait_ms=3.0), QueueingConsumer(gpu, busy_ms=1.0), non_blocking=True,
                    clock=_clock(gpu))
    result = measure_pass(loop, pass_plan(spec), TimingSink(), "async")
    assert [s.gpu_busy_ns for s in result.steps] == [1_000_000] * 8
    assert [s.gpu_idle_data_ns for s in result.steps] == [3_000_000] + [2_000_000] * 7
    summary = summary_row(split_window([result], 1), [], TimingSink(), 0, 1, 0)
    assert summary["step_sync"] == SYNC_ASYNC
    assert summary["starvation_pct"] == pytest.approx(100 * 17 / 25)
    assert summary["accel_util_pct"] == pytest.approx(100 * 8 / 25)
    assert summary["starvation_other_pct"] == pytest.approx(0.0)
    assert summary["samples_per_s"] == pytest.approx(8 * 4 / 25e-3)  # 4 samples a step, 25 ms of the GPU's clock
    assert loop.copier.gpu_ms == [0.0] * 8  # the fake copy queues no GPU work


def test_async_runs_where_a_consumer_trains_on_cuda_and_says_so_in_one_line_where_it_cannot():
    cpu_cnn = ToyCnnConsumer(compose_spec([*TINY_DATASET, "consumer=toy_cnn", "consumer.device=cpu"]).consumer, 0)
    for requested in ("auto", "async"):
        sync = resolve_sync(requested, cpu_cnn)
        assert sync.mode == SYNC_PER_STEP and sync.clock() is None
        assert sync.note is not None and len(sync.note.splitlines()) == 1 and "synchronous CPU path ran" in sync.note
    assert resolve_sync("auto", NoConsumer()).note is None  # nothing on a GPU to run ahead of
    emulated = EmulatedConsumer(StepTimeDistribution("fixed", 1.0), 0)
    assert resolve_sync("auto", emulated).note is None and resolve_sync("async", emulated).note is not None
    assert resolve_sync("per_step", cpu_cnn) == resolve_sync("per_step", NoConsumer())

    class CudaCnn(ToyCnnConsumer):
        def __init__(self):
            super().__init__(compose_spec([*TINY_DATASET, "consumer=toy_cnn", "consumer.device=cpu"]).consumer, 0)
            self.device = torch.device("cuda")  # stands in: resolving never touches CUDA

    cnn = CudaCnn()
    sync = resolve_sync("auto", cnn)
    assert sync.mode == SYNC_ASYNC and sync.note is None and isinstance(sync.clock(), AsyncStepClock)
    assert cnn._time_phases is False  # its steps stop waiting for their own kernels


def test_a_toy_cnn_told_to_run_ahead_times_no_phases():
    consumer = ToyCnnConsumer(compose_spec([*TINY_DATASET, "consumer=toy_cnn", "consumer.device=cpu"]).consumer, 0)
    consumer.run_ahead()
    for _ in range(2):
        consumer.step(torch.rand(2, 3, 8, 8), torch.tensor([1, 2]))
    report = consumer.report()
    assert report["timer"].startswith("none") and report["phases_ms"]["forward"] == {"n": 0}


BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "async_loop_check.py"


def test_the_async_loop_check_composes_its_settings_and_without_cuda_says_it_needs_a_gpu(monkeypatch, capsys):
    # Its main in-process, with the benchmarks folder on the path as a script run puts it: a fresh
    # Python importing torch costs ~6 s here.
    monkeypatch.syspath_prepend(str(BENCHMARK.parent))
    check = importlib.import_module("async_loop_check")
    for workers, chain in check.CASES.items():
        spec = compose_spec([*check.SETTINGS, chain, f"workers={workers}"])
        assert spec.run.sync == "async" and spec.loader.pin_memory and spec.consumer.kind == "toy_cnn"
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the check would measure")
    assert check.main([]) == 0
    assert capsys.readouterr().out.strip() == ("async_loop_check: needs a CUDA GPU (torch.cuda.is_available() is "
                                               "False); nothing measured")


@known_cost
def test_the_hand_written_loop_running_ahead_reads_a_pipeline_of_known_cost():
    """Its clocks are the plain loop's: 4 ms of work a sample, 4 a batch, emulated 10 ms a step, one
    process: 26 ms a step, 4 samples, about 154 samples/s (nothing to run ahead of on a CPU)."""
    spec = window_spec(compose_spec([*TINY_DATASET, "workers=0", "loader.batch_size=4", "consumer=emulated",
                                     "consumer.step_ms=10"]), steps=10, warmup=1)
    spec = dataclasses.replace(spec, per_sample=({"_target_": "pipebench.transforms.synthetic.BusyWait", "ms": 4.0},))
    measured = plain_loop(spec, run_ahead=True)
    assert measured.samples_per_s == pytest.approx(4000 / 26, rel=0.15)


def test_an_async_result_is_sound_its_steps_are_the_gpus_and_the_diagnosis_reads_the_gpus_busy_time():
    """result.json's integrity check (samples/s equal to what the passes give) holds at step_sync=async."""
    gpu = FakeGpu()
    spec = compose_spec([*TINY_DATASET, "workers=0", "run.steps=8", "run.min_time_s=0", "run.progress=false",
                         "loader.batch_size=4"])
    loop = StepLoop(FakeStream(gpu, wait_ms=3.0), QueueingConsumer(gpu, busy_ms=1.0), non_blocking=True,
                    clock=_clock(gpu))
    passes = [measure_pass(loop, pass_plan(spec), TimingSink(), "async")]
    window = split_window(passes, 1)
    summary = {**summary_row(window, [], TimingSink(), 0, 1, 0), "batch_size": 4}
    record = {"summary": summary, "passes": pass_records(window)}
    _check_row(JobResult.from_stored(record))
    assert record["passes"][0]["step_ms"] == pytest.approx([4.0] + [3.0] * 7)
    assert record["passes"][0]["gpu_busy_ms"] == pytest.approx([1.0] * 8)
    assert _consumer_ms(parse_all(PassRecord, record["passes"])) == pytest.approx(1.0)


def test_a_cpu_job_asking_for_async_says_on_one_line_that_the_synchronous_path_ran(tmp_path, capsys):
    spec = compose_spec([*TINY_DATASET, *QUICK_RUN, "transform.per_sample=[]", "transform.per_batch=[]", "workers=0",
                         "consumer=toy_cnn", "consumer.device=cpu",
                         "run.sync=async", "run.profile_steps=0"])
    summary = measure_job(spec, tmp_path).summary
    notes = [line for line in capsys.readouterr().out.splitlines() if "run.sync" in line]
    assert notes == ["note: run.sync=async: the consumer runs on cpu, not on a CUDA device, so the synchronous "
                     "CPU path ran (step_sync=per_step)"]
    assert summary.step_sync == SYNC_PER_STEP and summary.starvation_other_pct is None
