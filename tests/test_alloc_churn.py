"""The allocator-churn rule on synthetic reserved-memory series, and the tracker without CUDA."""

import pytest
import torch

from cuda_marks import NEEDS_CUDA
from pipebench.measure.gpu.alloc_churn import (
    OSCILLATION_MIN_REVERSALS,
    OSCILLATION_MIN_SWING_FRACTION,
    AllocatorTracker,
    is_oscillating,
    reversals,
)

MB = 1 << 20


@pytest.mark.parametrize("series, turns, oscillating", [
    ([100.0] * 10, 0, False),                                        # steady state
    ([100, 120, 140, 160, 180, 200], 0, False),                      # warm-up growth
    ([100, 101, 100, 101, 100, 101, 100], 0, False),                 # 1% rounding jitter: under the 5% floor
    ([100, 200, 100, 100, 100], 1, False),                           # one spike and its release
    ([100, 200, 100, 200], 2, False),                                # two reversals: not yet a cycle
    ([100, 200, 100, 200, 100], 3, True),                            # cudaMalloc / cudaFree every step
    ([100, 160, 150, 90, 95, 170, 100], 3, True),                    # noisy cycle: 160->150 and 90->95 are jitter
])
def test_reversals_and_the_oscillation_rule(series, turns, oscillating):
    assert reversals(series) == turns
    assert is_oscillating(series) is oscillating


def test_the_rule_follows_its_named_constants():
    saw = [100, 200, 100, 200, 100]
    assert OSCILLATION_MIN_REVERSALS == 3 and OSCILLATION_MIN_SWING_FRACTION == 0.05
    assert not is_oscillating(saw, min_reversals=4)
    # Swings of 100 on a peak of 200 are 50%: a 60% floor calls them jitter.
    assert reversals(saw, min_swing_fraction=0.6) == 0


def test_short_series_never_oscillate():
    assert reversals([]) == 0 and reversals([1.0, 2.0]) == 0


def test_tracker_without_cuda_records_nothing_and_says_why(monkeypatch):
    # Whether CUDA is initialised depends on what ran earlier in this process; what the tracker
    # promises is that it calls no CUDA API at all, so every one it could reach fails the test.
    def touched(*args, **kwargs):
        raise AssertionError("the tracker called CUDA without a CUDA device")

    for name in ("memory_stats", "memory_reserved", "init", "_lazy_init"):
        monkeypatch.setattr(torch.cuda, name, touched)
    for device in (None, torch.device("cpu")):
        tracker = AllocatorTracker(device)
        tracker.start()
        tracker.mark("first_measured")
        tracker.sample()
        tracker.mark("last_measured")
        tracker.stop()
        report = tracker.report()
        assert report.reserved_mb == [] and report.reserved_mb_peak is None and report.oscillating is None
        assert report.alloc_retries is None and report.device_frees is None
        assert report.note == "not measured: no CUDA consumer"
        assert set(tracker.columns().values()) == {None}


@NEEDS_CUDA
def test_tracker_sees_the_cache_released_and_refilled_on_cuda():
    """Allocating a 64 MiB block then emptying the cache, 4 times: reserved memory saws, frees counted."""
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    tracker = AllocatorTracker(device)
    tracker.mark("first_measured")
    for _ in range(4):
        block = torch.empty(64 * MB, dtype=torch.uint8, device=device)
        tracker.sample()
        del block
        torch.cuda.empty_cache()
        tracker.sample()
    tracker.mark("last_measured")
    report = tracker.report()
    assert len(report.reserved_mb) == 8 and report.reserved_mb_peak >= 64
    assert report.oscillating is True and report.reversals >= OSCILLATION_MIN_REVERSALS
    assert report.device_frees >= 4 and report.device_allocs >= 4 and report.alloc_retries == 0


def test_the_counters_grow_by_what_memory_stats_read_between_the_marks(monkeypatch):
    """Known truth: two retries, three device mallocs and frees between the marks; the tracker reads
    the counters by name from memory_stats and reports their growth (no CUDA: the reads are faked)."""
    reads = iter([{"num_alloc_retries": 1, "num_device_alloc": 4, "num_device_free": 0, "allocation.all.current": 9},
                  {"num_alloc_retries": 3, "num_device_alloc": 7, "num_device_free": 3}])
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: next(reads))
    tracker = AllocatorTracker(None)
    tracker.active = True
    tracker.mark("first_measured")
    tracker.mark("last_measured")
    report = tracker.report()
    assert (report.alloc_retries, report.device_allocs, report.device_frees) == (2, 3, 3)
