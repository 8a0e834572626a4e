"""Links in a results folder are never followed, and results are readable like any file.

A resumed sweep writes into a folder that may be shared (a team's results on a network file system,
CI artifacts). Every file pipebench or Hydra writes there replaces a link planted under its name,
never writes through it; a folder that is a link, and a lock file that is a link, are refused in
one line. Each test checksums the link's target before and after.
"""

import errno
import hashlib
import os
import re
import stat
from pathlib import Path

import hydra.core.utils
import psutil
import pytest
from conftest import FAST_JOB, NO_CHAIN, assert_config_error_is_one_line, results_folder
from fault_kit import Run
from omegaconf import OmegaConf
from stored_results import result_record, write_record

from pipebench.base.io import replacing, write_text_atomic
from pipebench.cli.main import main
from pipebench.sweep.expand import expand_sweep, sweep_overrides
from pipebench.measure import job_process
from pipebench.measure.job_process import save_hydra_file
from pipebench.record.folder_lock import LOCK_FILE, LockRefused, folder_lock
from pipebench.record.results import SUMMARY_CSV, load_job_results
from pipebench.record.resume import HYDRA_SWEEP_FILE, LinkedFolder, drop_links, ready_for_sweep, record_invocation
from pipebench.record.stored import DamagedFile, read_stored

# What a planted link points to: a file outside the results folder that must stay as it was.
VICTIM_TEXT = "root:x:0:0:root:/root:/bin/bash\n" * 40
# The files of a job folder that Hydra or the job writes, each planted as a link on resume.
JOB_FILES = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "job_task.log", "profile.txt")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _victim(tmp_path: Path, name: str = "victim.txt") -> Path:
    victim = tmp_path / "elsewhere" / name
    victim.parent.mkdir(exist_ok=True)
    victim.write_text(VICTIM_TEXT)
    return victim


def _plant(path: Path, victim: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        path.symlink_to(victim)
    else:
        os.link(victim, path)


def _own_file(path: Path) -> bool:
    """A regular file of the folder's own: no link, no other name."""
    info = path.lstat()
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_written_file_replaces_a_link_and_leaves_its_target_untouched(tmp_path, kind):
    folder = tmp_path / "results"
    victim = _victim(tmp_path)
    before = _digest(victim)
    for name in ("summary.csv", "trace.json"):
        _plant(folder / name, victim, kind)
    write_text_atomic(folder / "summary.csv", "job\n")
    with replacing(folder / "trace.json", ".json") as new:  # a writer that takes a name (torch.profiler)
        new.write_text("{}")
    assert _digest(victim) == before
    assert (folder / "summary.csv").read_text() == "job\n" and (folder / "trace.json").read_text() == "{}"
    assert all(_own_file(folder / name) for name in ("summary.csv", "trace.json"))
    assert sorted(p.name for p in folder.iterdir()) == ["summary.csv", "trace.json"], "no temporary file left"


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_get_the_mode_a_plain_open_gets(tmp_path, umask):
    previous = os.umask(umask)
    try:
        (tmp_path / "plain.txt").write_text("x")
        write_text_atomic(tmp_path / "report.md", "x")
        with replacing(tmp_path / "trace.json") as new:
            new.write_text("{}")
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"plain.txt": 0o666 & ~umask, "report.md": 0o666 & ~umask, "trace.json": 0o666 & ~umask}


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_the_lock_file_is_refused_when_it_is_a_link_and_nothing_is_written_there(tmp_path, kind):
    victim = _victim(tmp_path)
    before = _digest(victim)
    lock = tmp_path / "results" / LOCK_FILE
    if kind == "fifo":
        lock.parent.mkdir()
        os.mkfifo(lock)
    else:
        _plant(lock, victim, kind)
    what = {"symlink": f"a symbolic link to {victim}", "hardlink": "a hard link (2 names for one file)",
            "fifo": "not a regular file"}[kind]
    with pytest.raises(LockRefused, match=re.escape(f"refused {lock} as the folder's lock: it is {what}; pipebench "
                                                    "writes its process id into its lock file")):
        with folder_lock(lock.parent):
            pass
    assert _digest(victim) == before


def test_a_result_that_is_a_link_reads_as_a_link_and_text_as_not_json(tmp_path, capsys):
    victim = _victim(tmp_path, "passwd")
    result = write_record(tmp_path / "run", result_record(0, ["workers=0"]))
    result.unlink()
    result.symlink_to(victim)
    with pytest.raises(DamagedFile, match=re.escape(f"a symbolic link to {victim}, not a JSON file pipebench wrote")):
        read_stored(result)
    assert main(["report", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"{result}: a symbolic link to {victim}" in err, err
    result.unlink()
    result.write_text(VICTIM_TEXT)  # text, not JSON cut short
    with pytest.raises(DamagedFile, match=r"result.json: not JSON \(Expecting value at line 1 column 1\)"):
        read_stored(result)


def test_a_folder_that_is_a_link_is_refused_before_a_sweep_and_multirun_yaml_is_replaced(tmp_path):
    folder = tmp_path / "results" / "20990101-000000-x"
    (folder / "job-0" / ".hydra").mkdir(parents=True)
    victim = _victim(tmp_path)
    before = _digest(victim)
    (folder / HYDRA_SWEEP_FILE).symlink_to(victim)
    ready_for_sweep(folder)
    assert not (folder / HYDRA_SWEEP_FILE).exists() and _digest(victim) == before, "Hydra writes a new file"
    outside = tmp_path / "elsewhere"
    for link in (folder / "job-1", folder / "job-0" / ".hydra" / "more"):
        link.symlink_to(outside, target_is_directory=True)
        with pytest.raises(LinkedFolder, match=re.escape(f"{link} is a symbolic link to {outside}: pipebench writes "
                                                         "a results folder's own folders, never through a link")):
            ready_for_sweep(folder)
        link.unlink()


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_a_job_that_runs_again_drops_the_links_in_its_folder_and_keeps_its_own_files(tmp_path, kind):
    job_dir = tmp_path / "job-1"
    victim = _victim(tmp_path)
    before = _digest(victim)
    for name in JOB_FILES:
        _plant(job_dir / name, victim, kind)
    (job_dir / "error.txt").write_text("kept\n")
    drop_links(job_dir)
    assert _digest(victim) == before and victim.stat().st_nlink == 1
    assert sorted(str(p.relative_to(job_dir)) for p in job_dir.rglob("*") if not p.is_dir()) == ["error.txt"]
    linked = tmp_path / "job-2"
    linked.symlink_to(victim.parent, target_is_directory=True)
    drop_links(linked)
    assert not linked.exists() and victim.parent.is_dir() and _digest(victim) == before


def test_hydra_files_are_written_as_a_new_file_renamed_over_a_link(tmp_path):
    victim = _victim(tmp_path)
    before = _digest(victim)
    hydra_dir = tmp_path / "job-0" / ".hydra"
    _plant(hydra_dir / "overrides.yaml", victim, "symlink")
    save_hydra_file(OmegaConf.create(["workers=0"]), "overrides.yaml", hydra_dir)
    assert _digest(victim) == before and _own_file(hydra_dir / "overrides.yaml")
    assert OmegaConf.load(hydra_dir / "overrides.yaml") == ["workers=0"]


def test_the_job_process_saves_hydra_files_with_that_writer_and_names_one_it_cannot_write(tmp_path, monkeypatch,
                                                                                           capsys):
    """Hydra's run_job writes .hydra/ before the task runs: a file it cannot write there (a full
    disk) is the job's one line and exit 2, not Hydra's traceback."""
    saver = {}
    failed = tmp_path / "job-0" / ".hydra" / "config.yaml"

    def run_job(**kwargs):
        saver["now"] = hydra.core.utils._save_config
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(failed))

    monkeypatch.setattr(hydra.core.utils, "_save_config", hydra.core.utils._save_config)  # put back after
    monkeypatch.setattr(job_process, "run_job", run_job)
    config = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(tmp_path / "job-0")}}})
    assert job_process.run_payload(job_process.JobPayload(None, config, None, None)) == 2
    assert saver["now"] is save_hydra_file
    err = capsys.readouterr().err
    assert err.startswith(f"pipebench: error: {failed}: No space left on device (") and err.count("\n") == 1, err


def test_hydra_sweep_dir_is_refused_and_results_dir_named(tmp_path, capsys):
    for key in ("hydra.sweep.dir", "hydra.sweep.subdir"):
        assert_config_error_is_one_line([f"{key}={tmp_path / 'elsewhere'}", *NO_CHAIN, *FAST_JOB],
                                        "pass results_dir=DIR", capsys, tmp_path)
    assert not (tmp_path / "elsewhere").exists()


def _unfinished_sweep(results_dir: Path, overrides) -> Path:
    """An invocation folder of `overrides`' sweep with no job finished, as a resumed run finds it."""
    swept = sweep_overrides(overrides)
    folder = results_dir / "20990101-000000-links"
    record_invocation(folder, swept, expand_sweep(swept), overrides)
    return folder


def test_resume_refuses_a_job_folder_that_is_a_link_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    overrides = ["run.seed=1,2", *NO_CHAIN, *FAST_JOB, "results_dir=out"]
    folder = _unfinished_sweep(tmp_path / "out", overrides)
    outside = _victim(tmp_path).parent
    (folder / "job-1").symlink_to(outside, target_is_directory=True)
    before = {p.name: _digest(p) for p in outside.iterdir()}
    # Children of pytest from earlier tests (multiprocessing's resource tracker lives as long as pytest).
    earlier = {c.pid for c in psutil.Process().children()}
    assert main(["run", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipebench: error: ") and len(err.strip().splitlines()) == 1, err
    assert f"{Path('out') / folder.name / 'job-1'} is a symbolic link to {outside}" in err and "--fresh" in err
    assert {p.name: _digest(p) for p in outside.iterdir()} == before
    left = [c.cmdline() for c in psutil.Process().children() if c.pid not in earlier]
    assert not left, f"the job process started ahead is ended: {left}"


@pytest.mark.slow
def test_a_resumed_sweep_writes_no_file_through_a_link(tmp_path):
    """The whole command: every job file Hydra and the job write, the sweep's table and Hydra's
    multirun.yaml planted as links to a file outside; the resumed run replaces each one."""
    overrides = ["run.seed=1", *NO_CHAIN, *[o for o in FAST_JOB if not o.startswith(("trace=", "run.profile_steps"))],
                 "trace=torch", "run.profile_steps=1", "results_dir=out"]
    folder = _unfinished_sweep(tmp_path / "out", overrides)
    victim = _victim(tmp_path)
    before = _digest(victim)
    planted = [folder / "job-0" / name for name in JOB_FILES] + [folder / SUMMARY_CSV, folder / HYDRA_SWEEP_FILE]
    for n, path in enumerate(planted):
        _plant(path, victim, "symlink" if n % 2 else "hardlink")

    run = Run(tmp_path, tuple(overrides))
    try:
        status, orphans = run.finish()
    finally:
        run.clean_up()
    stdout, stderr = run.stdout.read_text(), run.stderr.read_text()
    assert status == 0 and "pipebench: error" not in stderr and "Traceback" not in stderr, stderr
    assert results_folder(stdout) == Path("out") / folder.name and "resuming" in stdout
    assert orphans == 0, "processes outlived the sweep"
    assert _digest(victim) == before and victim.stat().st_nlink == 1
    assert all(_own_file(path) for path in planted if path.exists())
    assert (folder / "job-0" / "profile.txt").is_file() and (folder / "job-0" / ".hydra" / "config.yaml").is_file()
    assert [r.config["run"]["seed"] for r in load_job_results(folder)] == [1]
