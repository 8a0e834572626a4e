"""The measured window on step series of known truth: epoch ends are found, kept apart from the
steady state, and priced; the rate over whole cycles is the true one."""

import queue
import sys
import threading
import time

import numpy as np
import pytest
import torch
from conftest import FAST_JOB, NO_CHAIN, TINY_DATASET, compose_spec
from torch.utils.data import DataLoader, TensorDataset

from pipebench.attach.watch import LoaderWatch, WatchWindow
from pipebench.attach.watched import watch_result
from pipebench.measure import window as window_module
from pipebench.measure.distributed.multirank import total_rate
from pipebench.measure.job import measure_job

from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED
from pipebench.measure.runner import StepLoop, measure_pass
from pipebench.measure.steps import WINDOW_TIME_CAP, PassResult, StepSample, TimingSink, WindowMarks, pass_plan
from pipebench.measure.summarize import pass_records, summary_row
from pipebench.measure.window import (
    RESTART_FIRST_BATCH,
    RESTART_MEASURED,
    RESTART_PERSISTENT,
    epoch_cost,
    epoch_rate,
    rate_interval,
    reused_window,
    split_window,
    window_note,
    window_record,
)
from pipebench.pipeline.consumers import NoConsumer
from pipebench.pipeline.timed_chain import TimedBatch
from pipebench.record.jobs import JobResult

MS = 1_000_000
BATCH = 8
CYCLE_MS = 100
READY_MS = 1
RESTART_MS = 300


def step(ms, epoch):
    return StepSample(gap_ns=0, wait_ns=int(ms * MS), h2d_ns=0, compute_ns=0, samples=BATCH, transfer_ns=0,
                      worker_id=0, ready=False, epoch=epoch)


def starved_pass(workers, cycles, epoch_every=None, first_batch_s=0.4, start_epoch=1):
    """Cycles of one long wait and W-1 ready batches; every `epoch_every` batches an epoch ends,
    and its first cycle waits RESTART_MS more (non-persistent workers starting again)."""
    steps, epoch, count = [], start_epoch, 0
    for _ in range(cycles):
        for k in range(workers):
            if epoch_every and count and count % epoch_every == 0:
                epoch += 1
                restart = RESTART_MS
            else:
                restart = 0
            long = k == 0
            steps.append(step((CYCLE_MS - (workers - 1) * READY_MS if long else READY_MS) + restart, epoch))
            count += 1
    return PassResult(first_batch_s, 0, steps, 0.0, epoch, {}, start_epoch)


def test_whole_cycles_without_epoch_ends_give_the_true_rate():
    result = starved_pass(4, 8)
    window = split_window([result], 4)
    assert len(window.blocks) == 8 and window.boundary_cycles == ()
    row = summary_row(window, [], TimingSink(), 4, 4, 0)
    assert row["samples_per_s"] == pytest.approx(4 * BATCH / (CYCLE_MS / 1000))
    assert row["samples_per_s_ci_low"] == pytest.approx(row["samples_per_s_ci_high"])
    assert row["epoch_boundaries_in_window"] == 0 and row["window_note"] is None


def test_an_epoch_end_is_left_out_of_the_steady_rate_and_priced():
    result = starved_pass(4, 12, epoch_every=20)  # epoch ends after batches 20 and 40
    window = split_window([result], 4)
    assert window.boundary_cycles == ((20, 24), (40, 44))
    cost = epoch_cost(window, 4, persistent=False)
    assert cost.source == RESTART_MEASURED and cost.restart_s == pytest.approx(RESTART_MS / 1000)
    row = summary_row(window, [], TimingSink(), 4, 4, 0, samples_per_epoch=20 * BATCH, batches_per_epoch=20)
    steady = 4 * BATCH / (CYCLE_MS / 1000)
    assert row["samples_per_s"] == pytest.approx(steady)
    epoch_seconds = 20 * BATCH / steady + RESTART_MS / 1000
    assert row["samples_per_s_epoch"] == pytest.approx(20 * BATCH / epoch_seconds)
    assert row["epoch_boundaries_in_window"] == 2
    assert "crossed 2 epoch end(s)" in row["window_note"] and "an epoch is 20 batches" in row["window_note"]


def test_an_epoch_end_between_warm_up_and_the_window_is_seen():
    result = starved_pass(2, 6, start_epoch=1)
    shifted = PassResult(0.4, 0, [step(s.wait_ns / MS, 2) for s in result.steps], 0.0, 2, {}, start_epoch=1)
    assert split_window([shifted], 2).boundary_cycles == ((0, 2),)


def test_without_an_epoch_end_the_restart_comes_from_the_first_batch_or_is_none():
    result = starved_pass(4, 8, first_batch_s=0.45)
    window = split_window([result], 4)
    cost = epoch_cost(window, 4, persistent=False)
    assert cost.source == RESTART_FIRST_BATCH and cost.restart_s == pytest.approx(0.45 - CYCLE_MS / 1000)
    assert epoch_cost(window, 4, persistent=True).source == RESTART_PERSISTENT
    assert epoch_rate(100.0, None, cost) is None


def test_epochs_shorter_than_a_cycle_say_so():
    result = starved_pass(4, 3, epoch_every=2)
    window = split_window([result], 4)
    assert window.crossed and window.blocks
    assert "every cycle of the window crossed an epoch end" in window_note(window, 2, 12)


def test_a_time_capped_window_says_so():
    result = starved_pass(2, 2)
    capped = PassResult(0.4, 0, result.steps, 0.0, 1, {}, 1, WINDOW_TIME_CAP)
    note = window_note(split_window([capped], 2), None, 16)
    assert note == "window capped by run.max_time_s at 4 steps (wanted 16)"


def test_interval_blocks_group_whole_cycles_to_a_time_span_and_never_cross_an_epoch_end():
    import numpy as np

    from pipebench.measure.window import interval_blocks

    result = starved_pass(2, 30, epoch_every=24)  # 100 ms cycles; an epoch end after batches 24 and 48
    window = split_window([result], 2)
    step_ns = np.array([s.step_ns for s in window.steps], dtype=float)
    blocks = interval_blocks(window, step_ns, 0.3e9, 4)  # 3 cycles a block
    # Epoch ends after batches 24 and 48 leave segments of 12, 11 and 5 steady cycles: a segment's
    # last block takes the cycles left over, and 5 cycles make one block of 5.
    assert [len(b) // 2 for b in blocks] == [3, 3, 3, 3] + [3, 3, 5] + [5]
    assert all(b[-1] - b[0] == len(b) - 1 for b in blocks)  # consecutive steps: none spans the epoch end
    assert sorted(i for b in blocks for i in b) == window.steady_indices().tolist()  # every steady step
    assert len(interval_blocks(window, step_ns, 10e9, 4)) >= 4  # lowered to keep enough blocks


def test_the_interval_holds_the_steady_rate_when_leftover_cycles_are_slow():
    """19 cycles make 9 blocks of 2 and one cycle over; that cycle 20x slow. Blocks that left it out
    gave an interval of the other 18 (a point at 160/s) beside a steady rate that counts it (80/s)."""
    steps = [step(ms, 1) for cycle in range(19)
             for ms in ((CYCLE_MS * (20 if cycle == 18 else 1) - READY_MS), READY_MS)]
    row = summary_row(split_window([PassResult(0.4, 0, steps, 0.0, 1, {}, 1)], 2), [], TimingSink(), 2, 2, 0)
    assert row["samples_per_s"] == pytest.approx(2 * BATCH * 19 / (CYCLE_MS * (18 + 20) / 1000))
    assert row["samples_per_s_ci_low"] <= row["samples_per_s"] <= row["samples_per_s_ci_high"]
    assert row["samples_per_s_ci_low"] < row["samples_per_s_ci_high"]  # the slow cycle is in a block


class _Producer:
    """One worker with `backlog` batches outstanding, as a BatchStream sees it: a batch every
    `period_s`, made on its own thread, so it goes on while the loop is held until every
    outstanding batch is made; taking one hands the worker the next."""

    in_process = False
    epochs = 1
    worker_startup_s: dict = {}

    def __init__(self, period_s: float, backlog: int) -> None:
        self.period_s = period_s
        self.made: "queue.Queue[TimedBatch]" = queue.Queue()
        self.outstanding = threading.Semaphore(backlog)
        self.stopped = threading.Event()
        self.made_at: list = []
        threading.Thread(target=self._make, daemon=True).start()

    def period_made_s(self) -> float:
        """The period the worker kept (a loaded host stretches its sleeps): the median gap between
        batches, which its pauses with every batch outstanding do not move."""
        return float(np.median(np.diff(self.made_at)))

    def _make(self) -> None:
        while not self.stopped.is_set():
            if not self.outstanding.acquire(timeout=0.05) or self.stopped.wait(self.period_s):
                continue
            self.made_at.append(time.perf_counter())
            self.made.put(TimedBatch(torch.zeros(BATCH, 1), torch.zeros(BATCH), np.zeros((BATCH, 1), np.int64),
                                     np.zeros(1, np.int64), np.zeros((BATCH, 1), np.int64), 0, (), 0, 0,
                                     time.perf_counter_ns()))

    def next(self) -> TimedBatch:
        batch = self.made.get(timeout=10)
        self.outstanding.release()
        return batch


PRODUCER_PERIOD_S = 0.02
# Longer than the producer needs to fill its slots (0.16 s for 8, 0.4 s for 20): the memory
# meter's first readings took half a second at 8 workers on the 2-core machine.
SLOW_MARK_S = 0.5
# A thread pipeline's queues (torchdata's, SPDL's stages and sink) hold more batches than
# workers x prefetch_factor: here 20 against the plan's 8.
DEEP_BACKLOG = 20
# The quick meters' first marks read /proc for every process, and wait for the GIL while worker
# threads hold it: 12 to 73 ms at one spdl thread on the 2-core machine. 0.1 s is 5 batches here,
# fewer than the backlog holds, so the producer never stops.
SLOW_QUICK_MARK_S = 0.1


@pytest.mark.parametrize("backlog, quick_s", [(8, 0.0), (DEEP_BACKLOG, 0.0), (8, SLOW_QUICK_MARK_S)],
                         ids=["a DataLoader's backlog", "a thread pipeline's deeper backlog", "slow quick marks"])
def test_slow_marks_give_the_window_no_free_batches(backlog, quick_s):
    """While the memory meter's first readings hold the loop, the workers fill their backlog. A
    window of 40 steps started right after would count it in no time: 8 batches read 1.25x the
    true rate, 20 read 2x. The drain takes the backlog, however deep, before the clock starts and
    before the other meters' marks; what is made while those read is the window's, and so is
    their time (without that, 5 batches free: 1.14x)."""
    spec = compose_spec([*TINY_DATASET, "workers=4", "loader.prefetch_factor=2", f"loader.batch_size={BATCH}",
                         "run.steps=40", "run.worker_cycles=1", "run.warmup_steps=0", "run.min_time_s=0",
                         "run.progress=false"])
    plan = pass_plan(spec)
    assert plan.drain == 8
    stream = _Producer(PRODUCER_PERIOD_S, backlog)
    marks, formed = [], []

    def slow_mark(name):
        marks.append(("holding", name, stream.made.qsize()))
        if name == FIRST_MEASURED:
            time.sleep(SLOW_MARK_S)
            formed.append(stream.made.qsize())

    def quick_mark(name):
        marks.append(("quick", name, stream.made.qsize()))
        if name == FIRST_MEASURED:
            time.sleep(quick_s)

    try:
        result = measure_pass(StepLoop(stream, NoConsumer(), non_blocking=False), plan, TimingSink(), "t",
                              marks=WindowMarks(slow_mark, quick_mark))
    finally:
        stream.stopped.set()
    # The backlog forms during the holding mark and is gone at the quick ones (one batch more,
    # were this thread held a whole period on a loaded host); the holding window holds theirs.
    assert [m[:2] for m in marks] == [("holding", FIRST_MEASURED), ("quick", FIRST_MEASURED),
                                     ("quick", LAST_MEASURED), ("holding", LAST_MEASURED)]
    assert marks[0][2] <= 1 and formed == [backlog] and marks[1][2] <= 1
    # The whole backlog, and the first batch made after the mark, which ends the drain.
    assert backlog * BATCH <= result.drained_samples <= (backlog + 2) * BATCH
    rate = sum(s.samples for s in result.steps) * 1e9 / sum(s.step_ns for s in result.steps)
    assert rate == pytest.approx(BATCH / stream.period_made_s(), rel=0.08)


def _counted_cuts(monkeypatch) -> list:
    """Every cut of a window from here on, wherever split_window was imported: the cycles cut with."""
    original = window_module.split_window
    cycles = []

    def counted(passes, cycle):
        cycles.append(cycle)
        return original(passes, cycle)

    for module in list(sys.modules.values()):
        if module.__name__.startswith("pipebench") and getattr(module, "split_window", None) is original:
            monkeypatch.setattr(module, "split_window", counted)
    return cycles


@pytest.mark.parametrize("workers, backend", [(0, "dataloader"), (2, "dataloader"), (2, "threads")])
def test_a_job_cuts_its_window_once_from_the_plans_cycle(tmp_path, monkeypatch, workers, backend):
    """The summary row, the raw steps' steady marks and the stored cut all read one cut, made
    with the plan's cycle (a thread pool's is one step whatever its workers)."""
    spec = compose_spec([*FAST_JOB, *NO_CHAIN, f"workers={workers}", f"loader.backend={backend}", "run.repeats=2"])
    cycles = _counted_cuts(monkeypatch)
    record = measure_job(spec, tmp_path)
    assert cycles == [pass_plan(spec).cycle]
    assert record.sections["window"]["cycle"] == pass_plan(spec).cycle
    assert record.sections["window"]["pass_steps"] == [len(one.samples) for one in record.pass_records]


def test_a_watched_loader_cuts_its_window_once(monkeypatch):
    loader = DataLoader(TensorDataset(torch.zeros(6 * BATCH, 2)), batch_size=BATCH, num_workers=0)
    watch = LoaderWatch(loader, WatchWindow(steps=8, skip_steps=1), site="train.py:1")
    for _ in range(3):
        for _batch in watch.epoch(lambda: iter(loader)):
            time.sleep(0.001)
    cycles = _counted_cuts(monkeypatch)
    result = watch_result(watch)
    assert cycles == [1]
    assert result.record.sections["window"]["pass_steps"] == [len(one.samples) for one in result.record.pass_records]


@pytest.mark.parametrize("short", [0, 1, 3, 6])
def test_a_reused_cut_over_shorter_passes_is_the_cut_of_those_passes(short):
    """Ranks that measured fewer steps than rank 0: its cut, reused over the steps all of them
    have, is what a fresh cut of those steps gives (epoch ends, a crossed pass, cycles cut short)."""
    passes = [starved_pass(4, 12, epoch_every=20), starved_pass(4, 3, epoch_every=2), starved_pass(4, 8)]
    record = window_record(split_window(passes, 4))
    shorter = [PassResult(p.first_batch_s, 0, p.steps[:len(p.steps) - short], 0.0, p.epochs, {}, p.start_epoch)
               for p in passes[:2]]
    assert reused_window(record, shorter) == split_window(shorter, 4)


def test_the_rank_merge_reuses_rank_0s_cut(monkeypatch):
    """The rate of all ranks together is read over the window rank 0 cut, not cut again."""
    window = split_window([starved_pass(4, 12, epoch_every=20)], 4)
    rank = JobResult.from_stored({"passes": pass_records(window), "window": window_record(window),
                                  "summary": {"samples_per_s": 320.0}})
    cycles = _counted_cuts(monkeypatch)
    total = total_rate([rank, rank])
    step_ns = np.array([s.step_ns for s in window.steps], dtype=np.float64)
    alone = rate_interval(window, np.array([s.samples for s in window.steps], dtype=np.float64), step_ns)
    assert cycles == [] and total["samples_per_s"] == 640.0 and total["ci_blocks"] == alone.blocks
