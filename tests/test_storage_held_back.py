"""What held the storage check back at the least N that missed: storage, CPU or the cost each step pays,
read from synthetic rounds whose figures are known."""

from pathlib import Path

import pytest

from pipebench.cli.storage_check import Check, Sizing
from pipebench.record.figures import Summary
from pipebench.storage_track.held_back import CPU, STEP_COST, STORAGE, WORKERS, Measured, held_back
from pipebench.storage_track.search import Probe, SearchOutcome

MIB = 1 << 20
# A round of 4 ranks: 320 samples/s of 100 KB, AU 80% of a 50 ms step.
ROUND = {"samples_per_s": 320.0, "au_pct": 80.0, "accel_util_pct": 80.0, "step_ms_mean": 62.5, "wait_ms_mean": 9.0,
         "collective_wait_ms_mean": 3.0, "process_cpu_ms_per_sample": 1.0, "host_other_cpu_cores": 0.1}
SAMPLE = 100_000
LINK_READ = 320.0 * SAMPLE / MIB  # the MiB/s that round reads: 30.5


def _rounds(**changes):
    return [Summary.from_row({**ROUND, **changes}), Summary.from_row({**ROUND, **changes})]


def test_a_link_read_near_its_bandwidth_is_the_storage():
    found = held_back(Measured(5, _rounds()), SAMPLE, 31.0, 16)
    assert found.by == STORAGE and found.read_mb_per_s == pytest.approx(LINK_READ)
    assert "the storage held 5 accelerator(s) back (AU 80.0%)" in found.line() and "of the link's 31 MiB/s" in found.line()


def test_busy_cores_with_the_link_short_of_full_are_the_cpu():
    # 1 ms a sample x 320 samples/s = 0.32 cores of the job's, 0.1 others': 0.42 of a half-core host.
    found = held_back(Measured(5, _rounds()), SAMPLE, 60.0, 16)
    assert found.by == STEP_COST
    found = held_back(Measured(5, _rounds(process_cpu_ms_per_sample=6.0)), SAMPLE, 60.0, 2)
    assert found.by == CPU and found.own_cores == pytest.approx(1.92) and found.other_cores == pytest.approx(0.1)
    assert "1.9 of the host's 2 cores busy with the job, 0.1 with other processes" in found.line()


def test_a_rank_drawing_what_its_workers_deliver_is_the_workers_with_the_cores_short_of_full():
    # 5 ranks drew 320 samples/s, 64 each; two workers a rank deliver at most 66.
    found = held_back(Measured(5, _rounds(worker_capacity_samples_per_s=66.0, workers=2)), SAMPLE, 60.0, 16)
    assert found.by == WORKERS and found.rank_samples_per_s == pytest.approx(64.0)
    assert ("each rank drew 64.0 samples/s, and its 2 worker(s) deliver at most 66.0, with 0.3 of the host's 16 "
            "cores busy") in found.line()
    # With room left in the workers, the same round is the cost each step pays.
    assert held_back(Measured(5, _rounds(worker_capacity_samples_per_s=200.0)), SAMPLE, 60.0, 16).by == STEP_COST


def test_neither_full_is_the_cost_each_step_pays_with_its_parts():
    # A step of 60 ms whose consumer was busy 80% of it lost 12 ms beside it, whatever the consumer.
    found = held_back(Measured(3, _rounds(step_ms_mean=60.0)), SAMPLE, 60.0, 16)
    assert found.by == STEP_COST and found.lost_ms == pytest.approx(12.0)
    line = found.line()
    assert "each step lost 12.0 ms" in line and "9.0 waiting for its batch, 3.0 at the all-reduce" in line
    assert f"with neither the link full (the ranks read {LINK_READ:.1f} of its 60 MiB/s) nor the CPU full (0.3 of" in line


def test_without_an_emulated_link_the_read_is_said_and_not_judged_full():
    found = held_back(Measured(2, _rounds()), SAMPLE, None, 16)
    assert found.by == STEP_COST and f"the reads at a plateau (the ranks read {LINK_READ:.1f} MiB/s)" in found.line()
    unknown = held_back(Measured(2, _rounds()), None, None, 16)
    assert unknown.read_mb_per_s is None and "the storage shown full (its reads unknown)" in unknown.line()
    assert held_back(Measured(2, []), SAMPLE, 30.0, 16) is None


def test_one_more_accelerator_adding_no_reads_is_the_storage_even_unemulated():
    # 4 ranks read 5% more than 3 did, with the CPU idle: the bandwidth's plateau.
    found = held_back(Measured(4, _rounds(), _rounds(samples_per_s=320.0 / 1.05)), SAMPLE, None, 16)
    assert found.by == STORAGE and f"against {LINK_READ / 1.05:.1f} with one accelerator fewer" in found.line()
    grew = held_back(Measured(4, _rounds(), _rounds(samples_per_s=240.0)), SAMPLE, None, 16)
    assert grew.by == STEP_COST
    # A lone accelerator has no all-reduce to wait at.
    assert "all-reduce" not in held_back(Measured(1, _rounds()), SAMPLE, None, 16).line()


def test_the_check_reads_the_least_n_that_missed_above_the_n_it_found(tmp_path: Path):
    check = Check(tmp_path, [], None, Sizing(lambda n: 1000, True, "", SAMPLE), 100)
    check.summaries = {3: _rounds(au_pct=93.0), 4: _rounds(au_pct=85.0), 6: _rounds(au_pct=40.0)}
    probes = (Probe(6, (40.0,), False), Probe(3, (93.0, 94.0), True), Probe(4, (85.0,), False))
    found = check.what_held_back(SearchOutcome(3, probes, False), 31.0)
    assert found.accelerators == 4 and found.au_pct == pytest.approx(85.0) and found.read_below_mb_per_s is not None
    assert check.what_held_back(SearchOutcome(6, (Probe(6, (95.0,), True),), True), 31.0) is None
