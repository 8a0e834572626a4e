"""Resume: re-running an interrupted sweep skips its finished jobs; a finished one, or --fresh, starts anew."""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import FAST_JOB, results_folder, run_cli
from fault_kit import CASE_TIMEOUT_S, fault_node, install_faults, markers_written, start_pipebench
from fault_transforms import ARMED
from stored_results import result_record, write_record

from pipebench.record.results import RESULT_FILE
from pipebench.record.resume import (
    INVOCATION_FILE,
    choose_invocation,
    record_invocation,
)
from pipebench.report.plots import THROUGHPUT_PNG, TRANSFORMS_PNG
from pipebench.report.writer import COMPARISON_CSV, COMPARISON_MD

# One usable core (taskset) makes workers=auto the three jobs 0, 1 and 2. Without taskset the same jobs are listed.
# Short jobs (FAST_JOB): the test reads which jobs ran, and when, not what they measured.
TASKSET = ["taskset", "-c", "0"] if shutil.which("taskset") else []
SWEEP = ["run", "--config-dir", "my_conf", "transform=tiny_gated", "workers=auto" if TASKSET else "workers=0,1,2",
         "loader.prefetch_factor=3", "loader.persistent_workers=true", *FAST_JOB, "results_dir=out"]
JOBS = 3
# The last job (workers=2): its workers hang in a Fault until Ctrl-C, so exactly the jobs before it
# are finished when the interrupt lands, however slow the machine (no guessed sleep decides it).
HUNG_WORKERS = 2


def _finished(out: Path):
    return sorted(out.glob(f"*/job-*/{RESULT_FILE}"))


@pytest.mark.slow
def test_interrupted_auto_sweep_resumes_without_remeasuring(user_project):
    markers = install_faults(user_project)
    chains = user_project / "my_conf" / "transform"
    (chains / "tiny_gated.yaml").write_text((chains / "tiny.yaml").read_text().replace(
        "per_batch:", fault_node(markers, "sleep", HUNG_WORKERS) + "per_batch:"))
    proc = start_pipebench(SWEEP, user_project, prefix=TASKSET, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        deadline = time.monotonic() + CASE_TIMEOUT_S
        while time.monotonic() < deadline and not markers_written(markers) and proc.poll() is None:
            time.sleep(0.05)
        assert markers_written(markers), "the last job never reached its hanging transform"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it to the whole group
        stdout, stderr = proc.communicate(timeout=60)
    finally:  # its job process and workers die with it (pipebench.base.lifeline)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    folder = user_project / results_folder(stdout)
    assert "workers-0+1+2" in folder.name, "workers=auto was expanded before the folder was named"
    before = {p: p.stat().st_mtime_ns for p in _finished(user_project / "out")}
    assert len(before) == JOBS - 1 and all(p.parent.parent == folder for p in before)

    (markers / ARMED).unlink()  # the resumed run's last job passes its samples through
    again = run_cli([*SWEEP[:1], "--baseline", "workers=1", *SWEEP[1:]], cwd=user_project, prefix=TASKSET)
    assert again.returncode == 0, again.stderr
    assert results_folder(again.stdout) == results_folder(stdout), "the same folder is reused"
    assert f"resuming {results_folder(stdout)}: {len(before)} of {JOBS} jobs already done" in again.stdout
    assert again.stdout.count("(already done, skipped)") == len(before)
    assert {p: p.stat().st_mtime_ns for p in before} == before, "finished jobs are not measured again"

    results = sorted((json.loads(p.read_text()) for p in _finished(user_project / "out")), key=lambda r: r["job_num"])
    assert [r["summary"]["workers"] for r in results] == [0, 1, 2]
    assert [r["fingerprint"]["start_method"] for r in results][0] == "none"
    assert all(r["config"]["loader"]["prefetch_factor"] == 3 for r in results)
    if TASKSET:
        assert all(r["fingerprint"]["usable_cores"] == 1 for r in results)
    table = (folder / COMPARISON_MD).read_text()
    assert table in again.stdout and "against `workers=1`" in table
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert header[0] == "workers" and "prefetch_factor" not in header, "a constant key is no axis"
    rows = list(csv.DictReader((folder / COMPARISON_CSV).open()))
    assert [(r["workers"], r["baseline"]) for r in rows] == [("0", "False"), ("1", "True"), ("2", "False")]
    assert re.search(rf"plot {THROUGHPUT_PNG}: written", again.stdout)
    assert (folder / THROUGHPUT_PNG).is_file() and (folder / TRANSFORMS_PNG).is_file()


def _fake_run(folder: Path, jobs, done: int) -> None:
    record_invocation(folder, ["workers=0,1"], jobs, ["workers=0,1"])
    for i, job in enumerate(jobs[:done]):
        write_record(folder, result_record(i, job))


def test_only_the_latest_incomplete_invocation_of_the_same_sweep_is_resumed(tmp_path):
    jobs = [["workers=0"], ["workers=1"]]
    new = tmp_path / "20990101-000000-new"
    fresh = choose_invocation(tmp_path, new, ["workers=0,1"], jobs, fresh=False)
    assert (fresh.folder, fresh.resumed) == (new, False) and new.is_dir(), "a new folder is created at once"
    _fake_run(tmp_path / "a", jobs, done=1)
    choice = choose_invocation(tmp_path, new, ["workers=0,1"], jobs, fresh=False)
    assert (choice.folder, choice.done, choice.total, choice.resumed) == (tmp_path / "a", 1, 2, True)
    assert choose_invocation(tmp_path, new, ["workers=0,1"], jobs, fresh=True).folder.name == f"{new.name}-2"
    assert choose_invocation(tmp_path, new, ["workers=0,2"], jobs, fresh=False).folder.name == f"{new.name}-3", \
        "another sweep"
    time.sleep(0.01)
    _fake_run(tmp_path / "b", jobs, done=2)  # a later, finished run of the same sweep
    assert choose_invocation(tmp_path, new, ["workers=0,1"], jobs, fresh=False).folder.name == f"{new.name}-4"
    assert json.loads((tmp_path / "a" / INVOCATION_FILE).read_text())["jobs"] == jobs
    twice = [["workers=0"], ["workers=0"]]  # one of two identical jobs finished: not complete
    _fake_run(tmp_path / "dup" / "c", twice, done=1)
    assert choose_invocation(tmp_path / "dup", new, ["workers=0,1"], twice, fresh=False).done == 1


def test_an_interrupted_exploration_of_the_same_chain_and_settings_is_found(tmp_path):
    from pipebench.explore.plan import unfinished_exploration

    swept = ("rounds=2", "transform=yuv_mask,yuv_mask+fast")
    jobs = [["run.round=0", "transform=yuv_mask"], ["run.round=0", "transform=yuv_mask+fast"]]
    folder = tmp_path / "20990101-000000-explore-yuv_mask"
    folder.mkdir()
    search_path = f"hydra.searchpath=['file://{folder}/variants']"  # names the folder, so never matched on
    record_invocation(folder, ["x"], jobs, [search_path, *swept])
    write_record(folder, result_record(0, jobs[0]))

    found = unfinished_exploration(tmp_path, "yuv_mask", swept)
    assert found is not None and (found.folder, found.done, found.total) == (folder, 1, 2)
    assert unfinished_exploration(tmp_path, "yuv_mask", ("rounds=3", *swept[1:])) is None, "other settings"
    assert unfinished_exploration(tmp_path, "yuv_mask_fast", swept) is None, "another chain"
    write_record(folder, result_record(1, jobs[1]))
    assert unfinished_exploration(tmp_path, "yuv_mask", swept) is None, "a finished exploration starts anew"
