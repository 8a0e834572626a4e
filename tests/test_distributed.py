"""Multi-rank jobs through the real CLI and torchrun: per-rank rows, aggregates, exactly-once, failures."""

import csv
import os

import numpy as np
import pytest
from conftest import NO_PROFILE, QUICK_RUN, compose_spec, results_folder, run_cli
from multirank_kit import SMALL, STRAGGLE_MS, TWO_RANKS, rank_results

from pipebench.config.specs import DistributedSpec
from pipebench.measure.distributed.multirank import (
    aggregate,
    exit_codes,
    merge_meter_columns,
    oversubscription_warning,
    rank_failure,
    resolve_backend,
    root_cause,
    total_rate,
)
from pipebench.measure.steps import PassResult, StepSample
from pipebench.measure.window import split_window, window_record
from pipebench.record.figures import Summary
from pipebench.record.jobs import JobResult

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

# A step of epoch 1 whose times do not matter: what a window's cut reads of it is its epoch.
IDLE_STEP = StepSample(gap_ns=0, wait_ns=0, h2d_ns=0, compute_ns=0, samples=0, transfer_ns=0, worker_id=0, ready=False)


# Eight steps a window, with no time floor: as many as the straggler's window held under run=quick's
# 0.5 s floor (~67 ms a step), where the balanced job's ran to 15 (~34 ms a step). A job's cost is then
# torchrun's and its ranks' start-up (~5 s), not its window (~0.3 s).
STRAGGLER_STEPS = ["run.steps=8", "run.min_time_s=0"]


@pytest.mark.slow
def test_two_ranks_balanced_straggler_and_a_rank_that_dies(rank_project):
    # One sweep (one CLI start-up): two good jobs, then one whose rank 1 dies at its first sample.
    proc = run_cli(["run", "--config-dir", "conf", "transform=balanced,straggler,dieonrank1", "workers=0", *SMALL,
                    *QUICK_RUN, *STRAGGLER_STEPS, *NO_PROFILE, *TWO_RANKS], cwd=rank_project)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pipebench: error:")]
    assert len(errors) == 1, proc.stderr
    assert "rank 1 failed (exit code 3): it exited without a Python error" in errors[0]
    assert "Traceback" not in proc.stderr
    folder = rank_project / results_folder(proc.stdout)
    balanced, straggler = rank_results(folder)  # the rows measured before the failure are kept

    for result in (balanced, straggler):
        assert [r["rank"] for r in result["ranks"]] == [0, 1]
        for row in result["ranks"]:
            assert row["samples_per_s"] > 0 and 0 <= row["starvation_pct"] <= 100
            assert row["wait_ms_p99"] >= row["wait_ms_median"] >= 0
        summary = result["summary"]
        assert summary["ranks"] == 2
        assert summary["samples_per_s"] == pytest.approx(sum(r["samples_per_s"] for r in result["ranks"]))
        assert summary["starvation_pct_max"] == max(r["starvation_pct"] for r in result["ranks"])
        coverage = result["coverage"]
        assert coverage["exactly_once"] and coverage["complete_epochs"] >= 1, coverage
        assert result["distributed"]["backend"] == "gloo"
        assert result["fingerprint"]["hostname"]
        assert set(result["rank_passes"]) == {"0", "1"} and result["passes"] == result["rank_passes"]["0"]
        assert len(result["passes"][0]["collective_ms"]) == summary["steps"]
        # Every rank ran the job's meters; the job's cells follow multirank.METER_MERGE.
        meters = [result["rank_meters"][r] for r in ("0", "1")]
        assert summary["rss_mb_peak"] == pytest.approx(sum(m["memory"]["rss_mb_peak"] for m in meters))
        assert summary["shm_mb_peak"] == max(m["memory"]["shm_mb_peak"] for m in meters)
        assert summary["storage_read_mb"] == pytest.approx(sum(
            m["storage_io"]["bytes"] for m in meters) / (1 << 20))
        assert summary["host_other_cpu_cores"] is not None and summary["host_steal_pct"] is not None
        assert summary["gpu_notes"] == meters[0]["gpu"]["note"] == "not measured: no CUDA"
    assert "coverage: every index exactly once" in proc.stdout
    assert f"straggler ratio {straggler['summary']['straggler_ratio']:.3f}" in proc.stdout

    # The slow rank's extra work shows as its busy time and as its peer's wait at the all-reduce.
    slow, fast = straggler["ranks"][1], straggler["ranks"][0]
    assert slow["busy_ms_mean"] - fast["busy_ms_mean"] > 0.5 * 8 * STRAGGLE_MS
    assert fast["collective_ms_mean"] - slow["collective_ms_mean"] > 0.5 * 8 * STRAGGLE_MS
    assert straggler["summary"]["straggler_ratio"] > balanced["summary"]["straggler_ratio"] + 0.1
    assert (straggler["summary"]["collective_wait_ms_mean"]
            > balanced["summary"]["collective_wait_ms_mean"] + 0.25 * 8 * STRAGGLE_MS)
    # The pooled transform table holds both ranks' samples (equal counts, as the ranks step together),
    # so the straggler's cost is the mean of the two ranks' own figures.
    pooled = {t["transform"]: t for t in straggler["transforms"]}
    own = [{t["transform"]: t for t in straggler["rank_transforms"][r]} for r in ("0", "1")]
    assert pooled["RankBusyWait"]["calls"] == own[0]["RankBusyWait"]["calls"] + own[1]["RankBusyWait"]["calls"]
    assert pooled["RankBusyWait"]["ms_per_sample"] == pytest.approx(
        (own[0]["RankBusyWait"]["ms_per_sample"] + own[1]["RankBusyWait"]["ms_per_sample"]) / 2, rel=1e-6)
    assert own[1]["RankBusyWait"]["ms_per_sample"] > 0.9 * STRAGGLE_MS > 10 * own[0]["RankBusyWait"]["ms_per_sample"]

    with (folder / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["ranks"] for r in rows] == ["2", "2"]
    assert all(float(r["straggler_ratio"]) >= 1 and float(r["collective_wait_ms_mean"]) > 0 for r in rows)
    assert "straggler_ratio" in (folder / "summary.md").read_text()


TORCHRUN_FAILURE = """\
Failures:
[1]:
  time      : 2026-11-22_13:05:37
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 9958)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_13:05:37
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 9959)
"""


def test_root_cause_is_torchruns_first_failure():
    # torchrun 2.x's summary (abridged): the SIGTERMed peer is listed first, the cause after it.
    assert root_cause(TORCHRUN_FAILURE) == (1, 3)
    assert root_cause("no summary here") is None
    assert exit_codes(TORCHRUN_FAILURE) == {0: -15, 1: 3}


# torchrun's summary when rank 1 died at os._exit(3) and rank 0, which lost it at the all-reduce,
# exited with its error at once: both seen in one poll, rank 0 named first.
PEER_SEEN_FIRST = """\
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 21760)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 21759)
"""


@pytest.mark.beside
@pytest.mark.parametrize("summary, errors, blamed", [
    (PEER_SEEN_FIRST, {0: "RuntimeError: Connection closed by peer"},
     "rank 1 failed (exit code 3): it exited without a Python error"),
    # The peer torchrun stopped (SIGTERM) wrote nothing, and is no cause.
    (TORCHRUN_FAILURE.replace("exitcode  : 3", "exitcode  : 1"), {1: "ValueError: bad sample"},
     "rank 1 failed (exit code 1): ValueError: bad sample"),
    # Every failed rank wrote its error: the first written is the cause.
    (PEER_SEEN_FIRST, {1: "ValueError: bad sample", 0: "RuntimeError: Connection closed by peer"},
     "rank 1 failed (exit code 3): ValueError: bad sample"),
])
def test_the_rank_blamed_is_the_one_that_failed_not_a_peer_that_lost_it(tmp_path, summary, errors, blamed):
    (tmp_path / "ranks.log").write_text(summary)
    for when, (rank, line) in enumerate(errors.items()):
        error = tmp_path / f"rank-{rank}.error"
        error.write_text(line + "\n")
        os.utime(error, ns=(when * 10**9, when * 10**9))
    assert rank_failure(tmp_path, 1).startswith(blamed)


def test_oversubscription_warning_counts_ranks_times_workers():
    spec = compose_spec(["distributed.nproc=2", "workers=3"])
    assert "2 ranks x 3 loader processes = 6 on 4 usable cores" in oversubscription_warning(spec, 4)
    assert oversubscription_warning(spec, 6) == ""
    assert "= 2 on 1 usable cores" in oversubscription_warning(compose_spec(["distributed.nproc=2"]), 1)


def test_backend_choice():
    assert resolve_backend("gloo", 2) == "gloo"
    # This suite runs without a GPU per rank: auto falls back to the CPU backend, nccl is refused.
    assert resolve_backend("auto", 64) == "gloo"
    with pytest.raises(Exception, match="needs a GPU per rank"):
        resolve_backend("nccl", 64)


def test_distributed_config_is_checked():
    assert compose_spec(["distributed.nproc=4"]).distributed == DistributedSpec(4, "auto", 300.0, 3600.0)
    for bad, message in [("distributed.nproc=0", "distributed.nproc must be >= 1"),
                         ("distributed.backend=mpi", "distributed.backend must be one of")]:
        with pytest.raises(Exception, match=message):
            compose_spec([bad])


def test_aggregate_straggler_ratio_is_slowest_over_median():
    def rank(busy, collective, rate, starvation):
        return JobResult.from_stored({"summary": {
            "busy_ms_mean": busy, "collective_ms_mean": collective, "collective_ms_p99": collective, "samples_per_s": rate,
            "samples_per_s_ci_low": rate - 1, "samples_per_s_ci_high": rate + 1, "starvation_pct": starvation,
            "au_pct": 100 - starvation, "steps": 10}})

    row = aggregate([rank(10, 5, 100, 20), rank(10, 4, 100, 30), rank(15, 0, 90, 60)])
    assert row["straggler_ratio"] == 1.5 and row["collective_wait_ms_mean"] == 3.0
    assert row["samples_per_s"] == 290 and row["starvation_pct"] == pytest.approx(110 / 3)
    assert row["starvation_pct_max"] == 60 and row["ranks"] == 3 and row["steps"] == 10
    assert "busy_ms_mean" not in row


def test_meter_cells_merge_by_their_rules():
    # Known truth: the host was 2.5 cores busy, each rank used 1.0 of them: 0.5 cores were others'.
    ranks = [{"host_other_cpu_cores": 1.5, "own_cpu_cores": 1.0, "rss_mb_peak": 300.0, "shm_mb_peak": 8.0,
              "gpu_util_pct": None, "gpu_notes": "not measured: no CUDA"},
             {"host_other_cpu_cores": 1.5, "own_cpu_cores": 1.0, "rss_mb_peak": 200.0, "shm_mb_peak": 9.0,
              "gpu_util_pct": None, "gpu_notes": "not measured: no CUDA"}]
    merged = merge_meter_columns([Summary.from_row(r) for r in ranks])
    assert merged["host_other_cpu_cores"] == pytest.approx(0.5)
    assert merged["rss_mb_peak"] == 500.0 and merged["shm_mb_peak"] == 9.0
    assert merged["gpu_util_pct"] is None and merged["gpu_notes"] == "not measured: no CUDA"
    assert merge_meter_columns([Summary.from_row({**ranks[0], "own_cpu_cores": None})])["host_other_cpu_cores"] is None


def _rank_record(step_ms, samples, workers=2):
    """A rank's record as multirank reads it: one pass of raw steps, all steady, one epoch, and
    its window's cut in cycles of `workers` steps."""
    cut = split_window([PassResult(1.0, 4, [IDLE_STEP] * len(step_ms), 0.0, 1, {})], workers)
    return JobResult.from_stored({"passes": [{"first_batch_s": 1.0, "warmup_steps": 4, "wall_s": sum(step_ms) / 1000, "epochs": 1,
                        "start_epoch": 1, "stop_reason": "window", "step_ms": list(step_ms),
                        "samples": list(samples), "epoch": [1] * len(step_ms)}],
            "window": window_record(cut),
            "summary": {"workers": workers, "samples_per_s": 1000.0 * sum(samples) / sum(step_ms)}})


def test_the_total_rate_interval_is_an_interval_of_the_sum_not_a_sum_of_bounds():
    """Known truth: two ranks whose samples a step trade off exactly, so every step the total is 16
    samples in 10 ms: the total is 1600 samples/s with no spread at all, while each rank alone
    swings by half (the old sum of the ranks' bounds was wide)."""
    steps = 800
    rng = np.random.default_rng(1)
    share = rng.integers(4, 13, steps)
    total = total_rate([_rank_record([10.0] * steps, share), _rank_record([10.0] * steps, 16 - share)])
    assert total["samples_per_s"] == pytest.approx(1600.0)
    assert total["samples_per_s_ci_low"] == pytest.approx(1600.0) and total["samples_per_s_ci_high"] == pytest.approx(1600.0)
    assert total["ci_blocks"] >= 8


def test_the_total_rate_interval_covers_the_true_total_of_independent_ranks():
    """Two ranks with independent step-to-step noise around a known total rate (16 samples every
    10 ms on average): the 95% interval of the total covers it in most runs, and it is narrower than
    the sum of the ranks' own intervals (about 1/sqrt(2) of it), since independent noise partly cancels."""
    rng = np.random.default_rng(7)
    covered, ratios = 0, []
    runs = 40
    for _ in range(runs):
        ranks = [_rank_record(rng.normal(10.0, 2.0, 800).clip(1.0), [8] * 800) for _ in range(2)]
        total = total_rate(ranks)
        true_rate = 16 / (10.0 / 1000)
        covered += total["samples_per_s_ci_low"] <= true_rate <= total["samples_per_s_ci_high"]
        alone = [total_rate([r]) for r in ranks]
        summed = sum(a["samples_per_s_ci_high"] - a["samples_per_s_ci_low"] for a in alone)
        ratios.append((total["samples_per_s_ci_high"] - total["samples_per_s_ci_low"]) / summed)
    assert covered >= 0.85 * runs and np.median(ratios) < 0.85
