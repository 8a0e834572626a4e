"""`pipebench storage-check`: its own keys taken off the jobs' overrides, a preset error's one line, and one short
check's files."""

import json

import pytest
from conftest import results_folder

from pipebench.base.errors import ConfigError
from pipebench.cli.main import main
from pipebench.storage_track.options import split_check_overrides

pytestmark = pytest.mark.slow


def test_the_check_s_own_keys_leave_the_jobs_overrides_and_a_bad_one_is_one_line_naming_it():
    options, rest = split_check_overrides(["workload=resnet50", "run.steps=5", "storage_check.runs=2",
                                           "storage_check.min_au_pct=80"])
    assert (options.workload, options.accelerator, options.runs, options.min_au_pct) == ("resnet50", None, 2, 80.0)
    assert rest == ["run.steps=5"]
    for bad, line in ((["storage_check.runs=0"], "storage_check.runs must be >= 1 and <= 1000, got 0"),
                      (["storage_check.runs=x"], "storage_check.runs: Value 'x' of type 'str' could not be"),
                      (["storage_check.workload=x"], "storage_check.workload: no such key")):
        with pytest.raises(ConfigError) as error:
            split_check_overrides(bad)
        assert str(error.value).startswith(line) and "\n" not in str(error.value)


def test_an_unknown_accelerator_is_one_line_listing_the_presets(tmp_path, capsys):
    """In this process, through `main`: the line and the status are main's, and a console script of its own
    would pay the interpreter and the verb's imports (~3 s) to say them."""
    assert main(["storage-check", "workload=resnet50", "accelerator=tpu", f"results_dir={tmp_path}"]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "accelerator 'tpu'" in line and "h100, a100" in line and "cosmoflow" in line


def test_a_short_check_writes_its_verdict_and_says_it_was_shortened(tmp_path, capsys):
    """One accelerator at most, one run: the verdict's shape and reasons, whatever the host's load. In this
    process, through `main`, as the test reads the check's files: its jobs run in job processes all the same."""
    status = main(["storage-check", "workload=custom", "dataset=storage_samples", "transform=none",
                   "dataset.sample_bytes=10000", "dataset.length=2000", "consumer.step_ms=40", "loader.batch_size=4",
                   "dataset.storage.shared_mb_per_s=50", "workers=1", "run.steps=8", "run.min_time_s=0.2",
                   "run.worker_cycles=1", "trace=none", "storage_check.runs=1", "storage_check.max_accelerators=1",
                   "storage_check.min_au_pct=10", f"results_dir={tmp_path}"])
    out, err = capsys.readouterr()
    assert status == 0, err
    folder = results_folder(out)
    verdict = json.loads((folder / "verdict.json").read_text())
    assert verdict["verdict"] in ("OPEN", "INVALID") and isinstance(verdict["accelerators"], int)
    assert "shortened: storage_check.runs=1 of 5" in verdict["reasons"]
    assert any("under 5x the host's memory" in r for r in verdict["reasons"])
    assert len(verdict["au_pct"]) == (1 if verdict["accelerators"] else 0)
    # One accelerator is the most it tries: it met there (capped, nothing missed) or says what held it back.
    held = verdict["held_back"]
    assert (held is None) == verdict["search_capped"]
    assert held is None or (held["accelerators"] == 1 and held["line"] in (folder / "report.md").read_text())
    assert "not MLPerf results" in (folder / "report.md").read_text()
    assert (folder / "search").is_dir()
