"""The rank merges' one fold (multirank.fold_ranks) over typed ranks: the job's row and sections in
their written order, a row a rank, and a total rate over the passes every rank measured."""

from dataclasses import fields

import pytest

from pipebench.measure.distributed.multirank import aggregate_line, fold_ranks, total_rate
from pipebench.measure.distributed.rank_result import RankResult, RankRow, StepNames
from pipebench.measure.steps import PassResult, StepSample
from pipebench.measure.summarize import pass_records
from pipebench.measure.window import split_window, window_record
from pipebench.record.jobs import JobResult

STEP_NS = 10_000_000
SAMPLES = 8
STEPS = 16
WORKERS = 2
# A multi-rank result.json's sections as the fold writes them, in order (the merges add their own around).
FOLDED_SECTIONS = ["transforms", "ranks", "rank_transforms", "passes", "window", "rank_passes"]


def _rank(rank: int, passes: int, busy_ms: float, collective_ms: float, starvation: float) -> RankResult:
    """A rank of `passes` passes of STEPS steps of STEP_NS, its figures planted in its summary."""
    steps = [StepSample(gap_ns=0, wait_ns=0, h2d_ns=0, compute_ns=STEP_NS, samples=SAMPLES, transfer_ns=0, worker_id=0,
                        ready=False)] * STEPS
    window = split_window([PassResult(1.0, 0, steps, 0.0, 1, {}) for _ in range(passes)], WORKERS)
    summary = {"samples_per_s": SAMPLES * 1e9 / STEP_NS, "starvation_pct": starvation, "au_pct": 100 - starvation,
               "busy_ms_mean": busy_ms, "collective_ms_mean": collective_ms, "collective_ms_p99": collective_ms,
               "steps": STEPS, "own_cpu_cores": 1.0}
    result = JobResult.from_stored({"summary": summary, "transforms": [{"transform": f"rank{rank}"}],
                                    "passes": pass_records(window), "window": window_record(window)})
    return RankResult(rank, result, StepNames())


def test_the_fold_writes_a_row_a_rank_and_the_sections_in_order():
    ranks = [_rank(0, 1, busy_ms=10.0, collective_ms=5.0, starvation=20.0),
             _rank(1, 1, busy_ms=15.0, collective_ms=0.0, starvation=60.0)]
    summary, sections = fold_ranks(ranks)
    assert list(sections) == FOLDED_SECTIONS
    assert sections["transforms"] == []  # no rank saved its timings
    assert [list(row) for row in sections["ranks"]] == [[f.name for f in fields(RankRow)]] * 2
    assert [(row["rank"], row["busy_ms_mean"], row["starvation_pct"]) for row in sections["ranks"]] == [
        (0, 10.0, 20.0), (1, 15.0, 60.0)]
    assert list(sections["rank_transforms"]) == ["0", "1"] and sections["rank_transforms"]["1"][0]["transform"] == "rank1"
    assert sections["passes"] == sections["rank_passes"]["0"]
    assert summary["ranks"] == 2 and summary["samples_per_s"] == pytest.approx(1600.0)
    assert summary["straggler_ratio"] == pytest.approx(15.0 / 12.5) and summary["au_pct"] == 40.0
    assert "busy_ms_mean" not in summary and "own_cpu_cores" not in summary
    assert aggregate_line(summary) == ("ranks: 2 ranks, 1600.0 samples/s in total, starvation 40.0% mean / 60.0% max, "
                                       "straggler ratio 1.200, 2.5 ms a step waiting at the all-reduce")


def test_the_total_rate_reads_the_passes_every_rank_measured():
    # A watched rank may measure a pass more than another: the total stops where the fewest end.
    longer, shorter = _rank(0, 2, 10.0, 0.0, 0.0), _rank(1, 1, 10.0, 0.0, 0.0)
    alike = [_rank(0, 1, 10.0, 0.0, 0.0), shorter]
    assert total_rate([longer.result, shorter.result]) == total_rate([r.result for r in alike])
