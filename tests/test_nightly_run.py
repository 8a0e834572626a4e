"""The nightly suite's rounds end to end: a real 2-round run with calibration, its rows and calibration
file, and `pipebench baseline update` from it. Each asserts on rows and files, not on a rate, so it
runs beside other tests (test_nightly.py measures, alone)."""

import csv
import json

import pytest
from conftest import FAST_JOB, NO_CHAIN, results_folder, run_cli

from pipebench.cli.main import main
from pipebench.measure import calibration
from pipebench.measure.fingerprint import machine_folder
from pipebench.record.baseline import update_baseline
from pipebench.record.results import CALIBRATION_FILE, load_job_results


@pytest.fixture(scope="module")
def tiny_rounds_run(tmp_path_factory):
    """A real 2-round run of one job with calibration (2 job processes), on random tensors, no transforms,
    each round as short as a job can be (FAST_JOB: no consumer, warm-up, profile or minimum time): the
    tests read its rows and files, not its figures. The calibration is most of its time.

    The round-robin order of a bigger sweep is test_nightly.py's test_rounds_sweep_round_robin: the CLI
    runs exactly that list.
    """
    cwd = tmp_path_factory.mktemp("rounds")
    proc = run_cli(["run", "rounds=2", "calibrate=true", *FAST_JOB, *NO_CHAIN, "results_dir=out"], cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return cwd / results_folder(proc.stdout)


@pytest.mark.slow
def test_real_run_has_a_row_per_round_and_writes_calibration(tiny_rounds_run):
    assert "-rounds-2_calibrate-true" in tiny_rounds_run.name
    with (tiny_rounds_run / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert ["run.round=0" in rows[0]["job"], "run.round=1" in rows[1]["job"]] == [True, True] and len(rows) == 2
    # A chain-free job's window holds too little CPU for the CPU reference's runs (too few for a median).
    assert all(row["reference_cpu_ms"] in ("", "nan") for row in rows)
    saved = json.loads((tiny_rounds_run / CALIBRATION_FILE).read_text())
    assert len(saved["samples_s"]) == calibration.CalibrationPlan().repetitions
    assert 0 < saved["score_s"] < 5 and saved["fingerprint"]["usable_cores"] >= 1


@pytest.mark.slow
def test_baseline_update_replaces_with_compare_inputs_only(tiny_rounds_run, tmp_path, capsys):
    machine = machine_folder(load_job_results(tiny_rounds_run)[0].fingerprint)
    target = tmp_path / "baselines" / machine / "nightly"
    target.mkdir(parents=True)
    (target / "stale.txt").write_text("old")
    (tiny_rounds_run / "job-0" / "trace.json").write_text("{}")  # traces never go into a baseline
    assert main(["baseline", "update", str(tiny_rounds_run), "--baselines-dir", str(tmp_path / "baselines")]) == 0
    out = capsys.readouterr().out
    assert f"replaced baseline {target}" in out and "job-1/result.json" in out
    copied = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert copied == sorted(["summary.csv", "calibration.json", "job-0/result.json", "job-1/result.json"])
    assert list((tmp_path / "baselines" / machine).iterdir()) == [target], "no staging folder left behind"
    assert update_baseline(tiny_rounds_run, tmp_path / "baselines", "other").replaced is False
