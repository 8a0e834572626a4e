"""Results are data: files planted or damaged where run, resume, report and compare read are never
executed, composed or unpickled, and each gets one line naming the file and what is wrong.

A planted payload would create MARKER; every test that plants one checks it was never created.
"""

import ast
import csv
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
from dataclasses import make_dataclass
from pathlib import Path

import pytest
from conftest import FAST_JOB, main_in, results_folder, run_cli
from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from stored_results import result_record, write_record

from pipebench.base.csv_cells import csv_table, csv_text, safe_cell
from pipebench.base.errors import printable
from pipebench.cli.main import main
from pipebench.config.compose import CONFIG_MODULE, CONFIG_NAME, HYDRA_VERSION_BASE
from pipebench.config.schema import register_schema
from pipebench.record.folder_lock import FolderBusy, folder_lock
from pipebench.record.results import (
    INTERVAL_EXCLUDES_NOTE,
    RESULT_FILE,
    SUMMARY_CSV,
    load_job_results,
    read_result,
    write_calibration,
    write_invocation_tables,
    write_result,
)
from pipebench.record.resume import (
    INVOCATION_FILE,
    REJECTED_FILE,
    choose_invocation,
    job_already_done,
    new_folder,
    record_invocation,
    stored_job,
    task_config,
)
from pipebench.record.stored import (
    RESULTS_SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    NewerFile,
)

PACKAGE = Path(__file__).resolve().parents[1] / "pipebench"
MARKER = "MARKER"

def test_a_stored_interval_that_excludes_its_rate_keeps_the_row_and_flags_it(tmp_path, capsys):
    """The interval leaving out the rate is no damage: the rate agrees with its raw steps, and
    pipebench itself once wrote such intervals. The job stays in summary.csv, and says why."""
    write_record(tmp_path, result_record(0, ["workers=0"]))
    rate = result_record(1, ["workers=1"])["summary"]["samples_per_s"]
    write_record(tmp_path, result_record(1, ["workers=1"], summary={"samples_per_s_ci_low": rate * 1.006,
                                                                    "samples_per_s_ci_high": rate * 1.017}))
    rows = write_invocation_tables(tmp_path)
    assert [row["job"] for row in rows] == ["workers=0", "workers=1"]
    flagged = {row["job"]: row["ci_note"] for row in csv.DictReader((tmp_path / SUMMARY_CSV).open())}
    assert flagged["workers=0"] == "" and flagged["workers=1"].startswith(INTERVAL_EXCLUDES_NOTE)
    assert main(["report", str(tmp_path)]) == 0 and "excludes" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Planted payloads: a launcher config whose interpreter, a pickle and a module would each create MARKER.

def _plant_payloads(folder: Path, project: Path) -> None:
    """Where Hydra, pickle or an import would pick them up if anything read this folder as code."""
    evil = project / "evil_python.sh"
    evil.write_text(f"#!/bin/sh\ntouch {project / MARKER}\nexec {sys.executable} \"$@\"\n")
    evil.chmod(0o755)
    launcher = ("_target_: hydra_plugins.pipebench_launcher.subprocess_launcher.SubprocessLauncher\n"
                f"python: {evil}\n")
    for root in (folder, folder / "variants"):
        (root / "hydra" / "launcher").mkdir(parents=True, exist_ok=True)
        (root / "hydra" / "launcher" / "pipebench_subprocess.yaml").write_text(launcher)
        (root / "payload.pkl").write_bytes(pickle.dumps(_Payload(project / MARKER)))
        (root / "sitecustomize.py").write_text(f"open({str(project / MARKER)!r}, 'w').close()\n")


class _Payload:
    """Unpickling it creates the marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _one_line(stderr: str, *needles: str) -> str:
    """The single stderr line holding every needle."""
    lines = [line for line in stderr.splitlines() if all(n in line for n in needles)]
    assert len(lines) == 1, f"no single line with {needles} in:\n{stderr}"
    return lines[0]


# ---------------------------------------------------------------------------------------------
# CSV cells: OWASP's rule, numbers untouched, and every writer goes through the helper.

@pytest.mark.parametrize("cell, written", [
    ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"), ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
    ("-2+3", "'-2+3"), ("@SUM(A1:A2)", "'@SUM(A1:A2)"), ("\tx", "'\tx"), ("\r=x", "'\r=x"),
    ("-3.5", "-3.5"), ("+1e-3", "+1e-3"), ("-inf", "-inf"), ("transform=a,workers=0", "transform=a,workers=0"),
    (-3.5, -3.5), (0, 0), (None, None), (True, True),
])
def test_a_cell_that_starts_a_formula_is_escaped_and_a_number_is_not(cell, written):
    assert safe_cell(cell) == written


def test_csv_reads_back_escaped_text_and_plain_numbers():
    text = csv_table(["=head", "rate"], [["=1+1", -3.5], ["-x", "-7"]])
    assert list(csv.reader(text.splitlines())) == [["'=head", "rate"], ["'=1+1", "-3.5"], ["'-x", "-7"]]
    assert csv_text([{"a": "@x", "b": 2, "c": "ignored"}], ["a", "b"]) == "a,b\n'@x,2\n"


def test_no_module_writes_csv_but_the_helper():
    writers = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "csv_cells.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("writer", "DictWriter") and \
                    isinstance(node.value, ast.Name) and node.value.id == "csv":
                writers.append(path.name)
    assert writers == [], "every CSV goes through pipebench.base.csv_cells"


def test_a_formula_in_a_job_label_is_escaped_in_the_invocation_tables_and_the_report(tmp_path):
    write_record(tmp_path, result_record(0, ["+x=1"], summary={"transform": "=cmd()"}))
    write_invocation_tables(tmp_path)
    (row,) = list(csv.DictReader((tmp_path / SUMMARY_CSV).open()))
    assert (row["job"], row["transform"], float(row["samples_per_s"]) > 0) == ("'+x=1", "'=cmd()", True)
    assert main(["report", str(tmp_path)]) == 0
    assert ",'+x=1," in (tmp_path / "comparison.csv").read_text()


# ---------------------------------------------------------------------------------------------
# Damaged and hostile result files: one loader, one line each, in report, compare and resume.

def _damage(kind: str, path: Path) -> None:
    record = json.loads(path.read_text())
    summary = record["summary"]
    text = None
    if kind == "truncated JSON":
        text = path.read_text()[: len(path.read_text()) // 2]
    elif kind == "not a JSON object":
        text = "[1, 2]"
    elif kind == "not UTF-8":
        path.write_bytes(b'{"job": "\xff"}')
        return
    elif kind == "missing key passes":
        del record["passes"]
    elif kind == "summary.samples_per_s is a string, not a number":
        summary["samples_per_s"] = "fast"
    elif kind == "samples_per_s edited":
        summary["samples_per_s"] *= 100
    elif kind == "not a finite number above 0":
        summary["samples_per_s"] = float("nan")
    elif kind == "disagrees with its passes":
        for one in record["passes"]:
            one["step_ms"] = [ms * 2 for ms in one["step_ms"]]
    elif kind == "no time was measured":
        record["passes"][0]["step_ms"] = [0.0] * len(record["passes"][0]["step_ms"])
    elif kind == "step stats":
        summary["step_ms_mean"] *= 3
    elif kind == "written by a newer pipebench":
        record[SCHEMA_VERSION_KEY] = 999
    path.write_text(text if text is not None else json.dumps(record))


DAMAGE = ["truncated JSON", "not a JSON object", "not UTF-8", "missing key passes",
          "summary.samples_per_s is a string, not a number", "samples_per_s edited",
          "not a finite number above 0",
          "disagrees with its passes", "no time was measured", "step stats", "written by a newer pipebench"]

# What the one-line error says for a kind whose name is not its message: an edited figure is caught
# by the raw steps it no longer matches.
MESSAGE = {"samples_per_s edited": "disagrees with its passes"}


def _two_jobs(folder: Path) -> Path:
    """A results folder of two sound jobs; returns job-1's result.json."""
    write_record(folder, result_record(0, ["workers=0"]))
    return write_record(folder, result_record(1, ["workers=1"], rates=[900.0, 950.0]))


@pytest.mark.parametrize("kind", DAMAGE)
def test_report_and_compare_name_a_damaged_result_on_one_line_and_exit_2(tmp_path, capsys, kind):
    base, current = tmp_path / "base", tmp_path / "current"
    _two_jobs(base)
    damaged = _two_jobs(current)
    assert main(["report", str(current)]) == 0 and main(["compare", str(base), str(current)]) == 0
    capsys.readouterr()
    _damage(kind, damaged)
    for args in (["report", str(current)], ["compare", str(base), str(current)]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("pipebench: error: "), err
        assert str(damaged) in err and MESSAGE.get(kind, kind) in err, err


def test_a_planted_name_or_value_with_a_newline_stays_one_line(tmp_path, capsys):
    _two_jobs(tmp_path)
    odd = write_record(tmp_path, result_record(0, ["workers=0"])).parent.rename(tmp_path / "job-0\nforged: line")
    (odd / RESULT_FILE).write_text('{"job": "x\n')
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "job-0\\nforged: line" in err, err
    stored = stored_job(tmp_path / "job-1", ["workers=1"], {"a\nb": 1})
    assert "a\\nb" in printable(stored.reason) and "\n" not in printable(stored.reason)


def test_a_file_without_a_version_is_version_1_and_writers_stamp_it(tmp_path):
    record = result_record(0, ["workers=0"])
    legacy = write_record(tmp_path / "old", record)
    assert SCHEMA_VERSION_KEY not in json.loads(legacy.read_text()) and read_result(legacy)["job_num"] == 0
    (tmp_path / "new" / "job-0").mkdir(parents=True)
    write_result(tmp_path / "new" / "job-0", record)
    record_invocation(tmp_path / "new", ["workers=0"], [["workers=0"]], ["workers=0"])
    write_calibration(tmp_path / "new", make_dataclass("Calibration", [("score_s", float), ("samples_s", list)])(
        0.1, [0.1, 0.1]))
    for name in (f"job-0/{RESULT_FILE}", INVOCATION_FILE, "calibration.json"):
        assert json.loads((tmp_path / "new" / name).read_text())[SCHEMA_VERSION_KEY] == RESULTS_SCHEMA_VERSION


@pytest.mark.parametrize("kind", DAMAGE)
def test_resume_runs_a_damaged_job_again(tmp_path, kind):
    path = _two_jobs(tmp_path)
    record = json.loads(path.read_text())
    assert stored_job(path.parent, ["workers=1"], record["config"]).done
    _damage(kind, path)
    stored = stored_job(path.parent, ["workers=1"], record["config"])
    assert not stored.done and str(path) in stored.reason and MESSAGE.get(kind, kind) in stored.reason and "\n" not in stored.reason


def test_resume_counts_damaged_jobs_as_not_done_and_refuses_a_newer_file(tmp_path, capsys):
    jobs = [["workers=0"], ["workers=1"]]
    folder = tmp_path / "a"
    record_invocation(folder, ["workers=0,1"], jobs, ["workers=0,1"])
    damaged = _two_jobs(folder)
    _damage("truncated JSON", damaged)
    choice = choose_invocation(tmp_path, tmp_path / "new", ["workers=0,1"], jobs, fresh=False)
    assert (choice.folder, choice.done, choice.resumed) == (folder, 1, True)
    _damage("written by a newer pipebench", folder / "job-0" / RESULT_FILE)
    with pytest.raises(NewerFile, match=r"job-0/result.json: written by a newer pipebench .* pass --fresh"):
        choose_invocation(tmp_path, tmp_path / "new", ["workers=0,1"], jobs, fresh=False)
    (folder / INVOCATION_FILE).write_text('{"swept": ')
    capsys.readouterr()
    assert not choose_invocation(tmp_path, tmp_path / "new", ["workers=0,1"], jobs, fresh=False).resumed
    assert _one_line(capsys.readouterr().err, str(folder / INVOCATION_FILE), "truncated JSON", "not resumed")


@pytest.fixture
def sweep_config():
    """A job's composed config with its `hydra` node, as the launcher holds it."""
    register_schema(ConfigStore.instance())
    with initialize_config_module(config_module=CONFIG_MODULE, version_base=HYDRA_VERSION_BASE):
        yield compose(CONFIG_NAME, overrides=["workers=1", "transform=yuv_mask"], return_hydra_config=True)


def test_resume_runs_a_job_again_when_its_resolved_config_changed(tmp_path, sweep_config, capsys):
    job_dir = tmp_path / "job-0"
    before = HydraConfig.instance().cfg
    config = task_config(sweep_config, job_dir)
    assert HydraConfig.instance().cfg is before, "the launcher's HydraConfig is left as it was"
    assert config["transform"]["per_sample"][1]["size"] == 256 and "hydra" not in config
    write_record(tmp_path, result_record(0, ["workers=1"], config=config))
    assert job_already_done(job_dir, ["workers=1"], sweep_config)
    assert not stored_job(job_dir, ["workers=2"], config).done

    edited = json.loads(json.dumps(config))
    edited["transform"]["per_sample"][1]["size"] = 128  # the YAML said 128 when this job ran
    write_record(tmp_path, result_record(0, ["workers=1"], config=edited))
    capsys.readouterr()
    assert not job_already_done(job_dir, ["workers=1"], sweep_config)
    _one_line(capsys.readouterr().err, str(job_dir / RESULT_FILE),
              "stored config differs at transform.per_sample.1.size (stored 128, now 256)", "running the job again")
    assert not (job_dir / RESULT_FILE).exists() and (job_dir / REJECTED_FILE).is_file(), "kept out of every table"


# ---------------------------------------------------------------------------------------------
# One run a folder: exclusive creation, and a lock the kernel releases when its holder dies.

def test_two_runs_started_in_the_same_second_never_share_a_folder(tmp_path):
    name = tmp_path / "results" / "20990101-000000-label"
    barrier = threading.Barrier(4)
    made = []

    def create():
        barrier.wait()
        made.append(new_folder(name))

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(p.name for p in made) == [name.name] + [f"{name.name}-{n}" for n in (2, 3, 4)]


def test_the_lock_refuses_a_second_holder_until_the_first_dies(tmp_path):
    with folder_lock(tmp_path):
        with pytest.raises(FolderBusy, match="in use by another pipebench run"):
            with folder_lock(tmp_path):
                pass
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from pipebench.record.folder_lock import "
         "folder_lock\nwith folder_lock(Path(sys.argv[1])):\n    print('locked', flush=True)\n    sys.stdin.read()",
         str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(FolderBusy, match=f"process {holder.pid} holds") as busy:
            with folder_lock(tmp_path):
                pass
        assert "\n" not in str(busy.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with folder_lock(tmp_path):  # released by the kernel when the holder died
        pass


# ---------------------------------------------------------------------------------------------
# File-system errors: one line, exit 2.

def test_a_results_path_under_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    _two_jobs(tmp_path / "run")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args in (["report", str(tmp_path / "run"), "--out", str(blocker / "out")],
                 ["compare", str(tmp_path / "run"), str(tmp_path / "run"), "--out", str(blocker / "out")],
                 ["run", "transform.per_sample=[]", *FAST_JOB, f"results_dir={blocker / 'out'}"]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("pipebench: error: ") and len(err.strip().splitlines()) == 1, err
        assert str(blocker) in err and "Not a directory" in err, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_results_folder_is_one_line_and_exit_2(tmp_path, capsys):
    _two_jobs(tmp_path / "run")
    (tmp_path / "run").chmod(0o555)
    try:
        assert main(["report", str(tmp_path / "run")]) == 2
    finally:
        (tmp_path / "run").chmod(0o755)
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Permission denied" in err, err


# ---------------------------------------------------------------------------------------------
# End to end: the real CLI, its launcher and job processes, against planted folders.

TINY_CHAIN = "per_sample:\n  - _target_: pipebench.transforms.synthetic.BusyWait\n    ms: {ms}\nper_batch: []\n"


@pytest.mark.slow
def test_resume_refuses_a_held_folder_then_reruns_damaged_and_changed_jobs_and_executes_nothing(
        tmp_path, capfd, monkeypatch):
    (tmp_path / "conf" / "transform").mkdir(parents=True)
    chain = tmp_path / "conf" / "transform" / "tiny.yaml"
    chain.write_text(TINY_CHAIN.format(ms=0))
    command = ["run", "--config-dir", "conf", "transform=tiny", "run.seed=1,2", *FAST_JOB, "results_dir=out"]
    status, out, err = main_in(tmp_path, command, capfd, monkeypatch)  # sets up the folder the test hurts
    assert status == 0, err
    shown = results_folder(out)  # relative to the cwd
    folder = tmp_path / shown
    assert json.loads((folder / INVOCATION_FILE).read_text())[SCHEMA_VERSION_KEY] == RESULTS_SCHEMA_VERSION
    planted = folder / "job-1" / RESULT_FILE
    _damage("samples_per_s edited", planted)
    _plant_payloads(folder, tmp_path)

    # In-process too: refused before any job process starts.
    with folder_lock(folder):
        assert main(command) == 2
    held = capfd.readouterr()
    assert _one_line(held.err, f"{shown} is in use by another pipebench run").startswith("pipebench: error: ")
    assert "[job " not in held.out and json.loads(planted.read_text())["summary"]["samples_per_s"] > 1e4

    chain.write_text(TINY_CHAIN.format(ms=0.001))  # edited between the runs
    again = run_cli(command, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"resuming {shown}" in again.stdout and "already done, skipped" not in again.stdout
    _one_line(again.stderr, str(shown / "job-0" / RESULT_FILE),
              "stored config differs at transform.per_sample.0.ms (stored 0, now 0.001)", "running the job again")
    _one_line(again.stderr, str(shown / "job-1" / RESULT_FILE), MESSAGE["samples_per_s edited"], "running the job again")
    results = load_job_results(folder)
    assert [r.config["transform"]["per_sample"][0]["ms"] for r in results] == [0.001, 0.001]
    assert (folder / "job-1" / REJECTED_FILE).is_file() and len(list(csv.DictReader((folder / SUMMARY_CSV).open()))) == 2
    assert not (tmp_path / MARKER).exists(), "a planted file was executed"


# One variant: the crop moves ahead of Scale; the trailing BusyWait has no per-batch form.
EXPLORE_CHAIN = ("per_sample:\n  - _target_: pipebench.transforms.color.Scale\n"
                 "  - _target_: torchvision.transforms.RandomCrop\n    size: 16\n"
                 "  - _target_: pipebench.transforms.synthetic.BusyWait\n    ms: 0\nper_batch: []\n")


@pytest.mark.slow
def test_resumed_explore_composes_nothing_from_its_folder(tmp_path, capfd, monkeypatch):
    """The first exploration sets the folder up in this process; the resumed one is the real command,
    a fresh process whose Hydra has registered nothing yet."""
    (tmp_path / "conf" / "transform").mkdir(parents=True)
    (tmp_path / "conf" / "transform" / "scaled.yaml").write_text(EXPLORE_CHAIN)
    command = ["explore", "--config-dir", "conf", "transform=scaled", "rounds=1", *FAST_JOB, "results_dir=out"]
    status, out, err = main_in(tmp_path, command, capfd, monkeypatch)  # sets up the folder the test hurts
    assert status == 0, err
    shown = results_folder(out)
    folder = tmp_path / shown
    assert json.loads((folder / "variants.json").read_text())[SCHEMA_VERSION_KEY] == RESULTS_SCHEMA_VERSION
    (folder / "job-1" / RESULT_FILE).unlink()  # interrupted before the variant's job finished
    _plant_payloads(folder, tmp_path)
    variant = folder / "variants" / "transform" / "scaled+crop_first.yaml"
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    variant.unlink()
    variant.symlink_to(victim)  # a write that followed it would overwrite the victim

    again = run_cli(command, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"resuming {shown}: 1 of 2 jobs already done" in again.stdout
    assert not (tmp_path / MARKER).exists(), "a planted file was executed"
    assert victim.read_text() == "untouched" and not variant.is_symlink()
    rerun = read_result(folder / "job-1" / RESULT_FILE)
    assert [n["_target_"] for n in rerun["config"]["transform"]["per_sample"]] == [
        "torchvision.transforms.RandomCrop", "pipebench.transforms.color.Scale", "pipebench.transforms.synthetic.BusyWait"]
