"""Nightly CI support: interleaved rounds, the calibration workload, suite=nightly, baseline update."""

import sys

import pytest
from conftest import QUICK_RUN, TINY_DATASET, compose_spec

from pipebench.base.errors import ConfigError
from pipebench.cli.main import main
from pipebench.sweep.expand import expand_sweep, sweep_overrides
from pipebench.config.compose import job_spec_composer
from pipebench.measure import calibration
from pipebench.transforms.synthetic import BusyWait

# Small enough for a unit test, big enough for a median: ~0.3 s of decode + chain.
TEST_PLAN = calibration.CalibrationPlan(repetitions=7, samples_per_repetition=4, warmup=1)
NIGHTLY_TRANSFORMS = ["yuv_mask", "yuv_mask_fast", "yuv_mask_crop_first", "yuv_mask_batched"]
# Five, not three: with 3 vs 3 samples a two-sided Mann-Whitney p cannot go below 0.1.
NIGHTLY_ROUNDS = 5


def _values(job, key):
    return next(item.split("=", 1)[1] for item in job if item.startswith(f"{key}="))


def test_rounds_sweep_round_robin():
    jobs = expand_sweep(sweep_overrides(["rounds=3", "workers=0,1"]))
    assert [(_values(j, "run.round"), _values(j, "workers")) for j in jobs] == [
        ("0", "0"), ("0", "1"), ("1", "0"), ("1", "1"), ("2", "0"), ("2", "1")]
    assert expand_sweep(sweep_overrides(["workers=0,1"])) == [["workers=0"], ["workers=1"]]


@pytest.mark.parametrize("override, key", [("rounds=0", "rounds"), ("run.round=-1", "run.round")])
def test_rounds_validated(override, key):
    with pytest.raises(ConfigError, match=key):
        compose_spec([override])


def test_suite_nightly_expands_and_validates_every_job():
    jobs = expand_sweep(sweep_overrides(["suite=nightly", "results_dir=results/nightly"]))
    assert len(jobs) == NIGHTLY_ROUNDS * len(NIGHTLY_TRANSFORMS) * 2
    rounds = [int(_values(j, "run.round")) for j in jobs]
    assert rounds == sorted(rounds), "rounds vary slowest, so drift hits every job alike"
    with job_spec_composer() as compose_one:
        specs = [compose_one(job)[0] for job in jobs[: len(jobs) // NIGHTLY_ROUNDS]]  # round 0
    assert [(s.transform_name, s.workers) for s in specs] == [(t, w) for t in NIGHTLY_TRANSFORMS for w in (0, 2)]
    assert all(s.calibrate and s.rounds == NIGHTLY_ROUNDS and s.trace == "none" and s.consumer.kind == "emulated"
               and s.dataset_name == "synthetic_jpeg" for s in specs)
    # A command-line override still wins over the suite, in place.
    assert len(expand_sweep(sweep_overrides(["suite=nightly", "workers=1"]))) == NIGHTLY_ROUNDS * len(NIGHTLY_TRANSFORMS)


def test_sweeping_an_invocation_key_is_one_line_error(capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # run puts the working directory on sys.path
    assert main(["run", "calibrate=true,false", *TINY_DATASET, *QUICK_RUN]) == 2  # fails before any job starts
    assert "calibrate applies to the whole invocation" in capsys.readouterr().err


# It reads the calibration's timings, which another test's CPU use would move: under xdist it runs alone. The
# module's other tests read expansions, specs and error lines, and share the cores.
@pytest.mark.alone
def test_calibration_is_sane_and_tracks_a_slowdown(monkeypatch):
    base = calibration.run_calibration(TEST_PLAN)
    assert len(base.samples_s) == TEST_PLAN.repetitions
    assert 0 < min(base.samples_s) <= base.score_s <= max(base.samples_s) < 5
    assert base.fingerprint["workload_version"] == calibration.WORKLOAD_VERSION
    # Extra CPU work equal to the measured cost of a sample should double the score.
    extra_ms = base.score_s / TEST_PLAN.samples_per_repetition * 1000
    chain = calibration.seed_chain
    monkeypatch.setattr(calibration, "seed_chain", lambda: [*chain(), BusyWait(extra_ms)])
    slowed = calibration.run_calibration(TEST_PLAN)
    assert 1.6 < slowed.score_s / base.score_s < 2.6


def test_baseline_update_cli_refuses_a_folder_without_results(tmp_path, capsys):
    assert main(["baseline", "update", str(tmp_path), "--baselines-dir", str(tmp_path / "b")]) == 2
    assert "no summary.csv" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()
