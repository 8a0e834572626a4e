"""The CPU reference: its schedule in the workers, what it leaves alone, and compare's CPU signal per reference ms."""

import pickle
import time
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import pytest
import torch
from conftest import FAST_JOB
from stored_results import result_record, write_record

from pipebench.cli.main import main
from pipebench.measure.steps import TimingSink
from pipebench.measure.summarize import MIN_REFERENCE_RUNS, reference_cpu_ms
from pipebench.measure.cpu_reference import REFERENCE_SHARE, REFERENCE_VERSION, CpuReference
from pipebench.storage.file_reads import NO_IO
from pipebench.pipeline.timed_chain import TimedCollate, TimedItem
from pipebench.record.results import load_job_results
from pipebench.regress.compare import (
    CPU_RATIO_PER_REFERENCE,
    CPU_RATIO_RAW,
    NO_CHANGE,
    SLOWER,
    WALL_ONLY,
    JobRuns,
    Run,
    compare_runs,
    load_run,
    render_csv,
    render_markdown,
)

PROBE_NS = 1_000_000  # a stand-in probe's cost, so the schedule is exact
JOB = "transform=chain,workers=2"
ROUNDS = 5
BASE_CPU_MS, BASE_REFERENCE_MS, BASE_RATE = 5.0, 4.0, 300.0
# A round's own spread, about what this machine shows between rounds of one job.
ROUND_CV = 0.02


class CountingReference(CpuReference):
    """A CpuReference whose probe costs PROBE_NS and counts its runs."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def probe(self) -> int:
        self.runs += 1
        return PROBE_NS


def test_the_first_batch_probes_then_one_probe_for_every_share_of_the_batches_cpu():
    reference = CountingReference()
    assert reference.after_batch(10) == PROBE_NS  # at once: it learns what a probe costs
    every_ns = int(PROBE_NS / REFERENCE_SHARE)
    batch_ns = -(-every_ns // 4)  # four batches reach the due CPU, three do not
    answers = [reference.after_batch(batch_ns) for _ in range(8)]
    assert answers == [0, 0, 0, PROBE_NS, 0, 0, 0, PROBE_NS]
    assert reference.runs == 3


def test_a_workers_copy_carries_the_inputs_and_starts_its_count_afresh():
    reference = CpuReference()
    assert reference.after_batch(0) > 0
    assert reference.after_batch(0) == 0  # not due again so soon
    copy = pickle.loads(pickle.dumps(reference))
    assert copy._jpeg == reference._jpeg and len(copy._chain) == len(reference._chain)
    assert copy.after_batch(0) > 0  # a fresh worker probes its first batch


def test_a_probe_leaves_torchs_random_stream_where_it_was():
    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    CpuReference().probe()
    assert torch.equal(torch.rand(4), expected)


def _item(index: int) -> TimedItem:
    return TimedItem(torch.zeros(3), 0, np.zeros(3, np.int64), 2_000_000, index, NO_IO)


class SpinningReference(CountingReference):
    """A probe that spends PROBE_NS of real thread CPU, and a record of the CPU each batch reported to it."""

    def __init__(self) -> None:
        super().__init__()
        self.given: List[int] = []

    def after_batch(self, batch_cpu_ns: int) -> int:
        self.given.append(batch_cpu_ns)
        return super().after_batch(batch_cpu_ns)

    def probe(self) -> int:
        super().probe()
        start = time.thread_time_ns()
        while time.thread_time_ns() - start < PROBE_NS:
            pass
        return PROBE_NS


def test_the_collate_runs_the_reference_after_the_batch_and_keeps_it_out_of_the_batchs_cpu():
    reference = SpinningReference()
    collate = TimedCollate([], reference)
    batch = collate([_item(0), _item(1)])
    assert batch.reference_cpu_ns == PROBE_NS and reference.runs == 1
    # The batch's CPU was read before the probe spun, and not again after: what the reference was told
    # is exactly the batch's figure and its samples', so none of the probe's spin is in it (an order,
    # not a time: the check holds on any host).
    assert reference.given == [batch.batch_cpu_ns + int(batch.sample_cpu_ns.sum())]
    # The batch's samples count towards the next probe: 4 ms of samples a batch against 33 ms due
    # (1 ms / REFERENCE_SHARE), so the 9th batch runs it and no other of these 14 does.
    assert [collate([_item(0), _item(1)]).reference_cpu_ns for _ in range(14)].count(PROBE_NS) == 1
    assert TimedCollate([])([_item(0)]).reference_cpu_ns == 0  # calibrate=false: no reference


def test_the_round_figure_is_the_mean_of_the_probes_and_empty_with_too_few():
    # Two modes, as measured beside a 2-worker loader: the mean weighs them as the chain's total
    # does (their median reads 7 ms, the upper mode).
    sink = TimingSink(reference_cpu_ns=[5_000_000, 7_000_000, 5_000_000, 7_000_000, 7_000_000])
    assert reference_cpu_ms(sink) == pytest.approx(6.2)
    assert np.isnan(reference_cpu_ms(TimingSink(reference_cpu_ns=[3_000_000] * (MIN_REFERENCE_RUNS - 1))))
    assert np.isnan(reference_cpu_ms(TimingSink()))


@pytest.mark.slow
def test_a_real_job_with_calibrate_true_records_the_reference_beside_its_measured_batches(tmp_path):
    # 4 ms of CPU a sample, 8 a batch: a probe (~5 ms) is due about every 8 batches, so the 96
    # measured steps hold about 12, past MIN_REFERENCE_RUNS even where a loaded host makes each
    # probe cost twice its CPU and comes due half as often (48 steps once read nan so).
    chain = "transform.per_sample=[{_target_: pipebench.transforms.synthetic.BusyWait, ms: 4.0}]"
    assert main(["run", *FAST_JOB, "transform.per_batch=[]", chain, "run.steps=96", "calibrate=true", "workers=0",
                 f"results_dir={tmp_path}"]) == 0
    (record,) = load_job_results(next(tmp_path.iterdir()))
    assert record.summary.reference_cpu_ms > 0
    assert record.summary.reference_version == REFERENCE_VERSION
    assert record.summary.cpu_ms_per_sample >= 4.0  # the chain's own CPU, the reference not in it


def _side(rng: np.random.Generator, cpu_factor: float, reference_factor: float, rate_factor: float,
          with_reference: bool = True) -> JobRuns:
    """One job's 5 rounds: CPU time, the reference and the rate, each scaled, with ROUND_CV noise."""
    def noisy(mean: float) -> tuple:
        return tuple(mean * (1 + ROUND_CV * rng.standard_normal(ROUNDS)))
    # The host's speed of the moment moves the chain and the reference together.
    host = 1 + ROUND_CV * rng.standard_normal(ROUNDS)
    cpu = tuple(np.array(noisy(BASE_CPU_MS * cpu_factor)) * host)
    reference = tuple(np.array(noisy(BASE_REFERENCE_MS * reference_factor)) * host) if with_reference else ()
    rates = noisy(BASE_RATE * rate_factor)
    return JobRuns(JOB, rates, (50.0,) * ROUNDS, {}, {}, rounds=tuple(range(ROUNDS)), round_samples_per_s=rates,
                   cpu_ms_per_sample=cpu, reference_cpu_ms=reference)


def _compare(baseline: JobRuns, current: JobRuns):
    return compare_runs(Run(Path("base"), {JOB: baseline}, None), Run(Path("head"), {JOB: current}, None))


@pytest.mark.parametrize("seed", range(5))
def test_a_busier_host_moves_cpu_time_and_its_reference_alike_and_is_not_a_regression(seed):
    rng = np.random.default_rng(seed)
    # Issue 41's hog: 12% more CPU time a sample, 25% less throughput, the same code.
    comparison = _compare(_side(rng, 1.0, 1.0, 1.0), _side(rng, 1.12, 1.12, 0.75))
    job = comparison.jobs[0]
    assert comparison.cpu_per_reference
    assert job.cpu_verdict == NO_CHANGE and job.verdict == WALL_ONLY
    assert job.current_cpu_ms / job.baseline_cpu_ms == pytest.approx(1.12, rel=0.05)  # raw figures still shown
    assert job.current_reference_ms / job.baseline_reference_ms == pytest.approx(1.12, rel=0.05)


@pytest.mark.parametrize("seed", range(5))
def test_a_chain_15_percent_dearer_is_slower_per_reference(seed):
    rng = np.random.default_rng(seed)
    comparison = _compare(_side(rng, 1.0, 1.0, 1.0), _side(rng, 1.15, 1.0, 0.87))
    job = comparison.jobs[0]
    assert job.cpu_verdict == SLOWER and job.verdict == SLOWER
    assert job.cpu_ratio == pytest.approx(1.15, rel=0.04)


def test_without_the_reference_on_a_side_raw_cpu_time_decides_and_the_report_says_how_to_get_it():
    rng = np.random.default_rng(0)
    comparison = _compare(_side(rng, 1.0, 1.0, 1.0, with_reference=False), _side(rng, 1.12, 1.12, 0.75))
    assert not comparison.cpu_per_reference
    assert comparison.jobs[0].cpu_verdict == SLOWER  # what a busy host did to compare before the reference
    assert "calibrate=true" in render_markdown(comparison)
    assert render_csv(comparison).splitlines()[1].endswith(CPU_RATIO_RAW)


def _write_rounds(folder: Path, cpu_ms: Sequence[float], reference_ms: Optional[Sequence[float]],
                  version: Optional[int] = REFERENCE_VERSION) -> Path:
    """Stored rounds; `version` None writes none, as results from before the reference's version."""
    for num, cpu in enumerate(cpu_ms):
        summary = {"cpu_ms_per_sample": cpu}
        if reference_ms is not None:
            summary["reference_cpu_ms"] = reference_ms[num]
        if version is not None:
            summary["reference_version"] = version
        overrides = ["transform=chain", f"run.round={num + 1}"]
        write_record(folder, result_record(num, overrides=overrides, rates=(BASE_RATE,), summary=summary))
    (folder / "summary.csv").write_text("job\n")
    return folder


def test_stored_rounds_carry_the_reference_into_compare_and_its_csv(tmp_path):
    base = _write_rounds(tmp_path / "base", [5.0, 5.1, 4.9, 5.0, 5.05], [4.0, 4.1, 3.9, 4.0, 4.02])
    busy = _write_rounds(tmp_path / "busy", [5.6, 5.7, 5.5, 5.6, 5.65], [4.48, 4.6, 4.36, 4.48, 4.5])
    comparison = compare_runs(load_run(str(base)), load_run(str(busy)))
    assert comparison.cpu_per_reference
    assert comparison.jobs[0].cpu_verdict == NO_CHANGE
    assert comparison.jobs[0].baseline_reference_ms == pytest.approx(4.0)
    assert render_csv(comparison).splitlines()[1].endswith(CPU_RATIO_PER_REFERENCE)


def test_a_reference_of_another_version_on_one_side_is_not_divided_by(tmp_path):
    # The same chain; the baseline stored before the reference's figure became a mean (no version
    # recorded: the median), which can read lower on the same host (here 7%).
    cpu = [5.0, 5.1, 4.9, 5.0, 5.05]
    base = _write_rounds(tmp_path / "base", cpu, [4.0, 4.1, 3.9, 4.0, 4.02], version=None)
    head = _write_rounds(tmp_path / "head", cpu, [4.3, 4.4, 4.2, 4.3, 4.32])
    assert compare_runs(load_run(str(base)), load_run(str(base))).cpu_per_reference  # one version: divided
    comparison = compare_runs(load_run(str(base)), load_run(str(head)))
    assert not comparison.cpu_per_reference  # else the new meaning reads as a 7% cheaper chain
    assert comparison.jobs[0].cpu_verdict == NO_CHANGE
    assert "older pipebench" in render_markdown(comparison)
    assert render_csv(comparison).splitlines()[1].endswith(CPU_RATIO_RAW)
