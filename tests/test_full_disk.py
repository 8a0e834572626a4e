"""A full disk: one line naming the file that could not be written and the space its folder had,
no row lost, no folder left by a run that could not start, and the sweep resumed once space is freed.

Each test mounts a small tmpfs and fills it; where mounting is not allowed (not root, no
CAP_SYS_ADMIN, no `mount`) it skips, saying why.
"""

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FAST_JOB, results_folder
from fault_kit import CONF, FAULT_CHAIN, Run, fault_node, install_faults
from fault_transforms import ARMED, FILLER, fill

from pipebench.base.errors import PipebenchError, error_line
from pipebench.base.io import write_text_atomic
from pipebench.cli.dataset import convert
from pipebench.cli.main import main
from pipebench.record.folder_lock import LOCK_FILE, folder_lock
from pipebench.record.results import RESULT_FILE, load_job_results

# Big enough for a results folder of a few tiny jobs, small enough to fill in a moment.
SMALL_FS = "4m"
FULL = "No space left on device (0 B free of 4.0 MiB in "


@pytest.fixture
def small_fs(tmp_path):
    """An empty tmpfs of SMALL_FS, mounted for the test."""
    point = tmp_path / "fs"
    point.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no `mount` command to mount a small file system")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_FS}", "tmpfs", str(point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (root or CAP_SYS_ADMIN needed): {mounted.stderr.strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=True)


def test_a_write_on_a_full_disk_names_its_file_and_the_space_left_and_keeps_the_old_file(small_fs):
    summary = small_fs / "summary.csv"
    summary.write_text("job\n")
    fill(small_fs / FILLER)
    with pytest.raises(OSError) as full:
        write_text_atomic(summary, "job\n" * 10_000)
    assert error_line(full.value) == f"{summary}: {FULL}{small_fs})"
    assert summary.read_text() == "job\n" and sorted(p.name for p in small_fs.iterdir()) == [FILLER, "summary.csv"]
    with pytest.raises(OSError) as locked:
        with folder_lock(small_fs):
            pass
    assert error_line(locked.value) == f"{small_fs / LOCK_FILE}: {FULL}{small_fs})"


def test_a_run_that_starts_on_a_full_disk_is_one_line_and_leaves_no_folder(small_fs, capsys):
    (small_fs / "out").mkdir()
    fill(small_fs / FILLER)
    assert main(["run", "transform.per_sample=[]", *FAST_JOB, f"results_dir={small_fs / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipebench: error: ") and len(err.strip().splitlines()) == 1, err
    assert f"{LOCK_FILE}: {FULL}" in err, err
    assert list((small_fs / "out").iterdir()) == [], "no empty run folder is left"


# Room for the run's lock and invocation.json (a tmpfs page each), not for Hydra's multirun.yaml.
SWEEP_START_ROOM = 8 << 10


def _leave_room(fs: Path, room: int) -> None:
    """Fill `fs` all but `room` bytes."""
    reserve = fs / "reserve"
    reserve.write_bytes(b"\0" * room)
    fill(fs / FILLER)
    reserve.unlink()


def test_a_sweep_whose_multirun_yaml_does_not_fit_is_one_line_exit_2_and_leaves_no_folder(small_fs, capsys):
    (small_fs / "out").mkdir()
    _leave_room(small_fs, SWEEP_START_ROOM)
    assert main(["run", "transform.per_sample=[]", *FAST_JOB, f"results_dir={small_fs / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipebench: error: ") and len(err.strip().splitlines()) == 1, err
    assert f"multirun.yaml: {FULL}" in err, err
    assert list((small_fs / "out").iterdir()) == [], "no folder with a truncated multirun.yaml is left"


def _sweep(project: Path, markers: Path, results: Path) -> Run:
    """Two jobs (workers=0,1); the second fills the disk `markers` is on while it measures."""
    (project / CONF / "transform").mkdir(parents=True, exist_ok=True)
    (project / CONF / "transform" / f"{FAULT_CHAIN}.yaml").write_text(
        "per_sample:\n" + fault_node(markers, "fill", 1) + "per_batch: []\n")
    return Run(project, ("--config-dir", CONF, f"transform={FAULT_CHAIN}", "workers=0,1", *FAST_JOB,
                         f"results_dir={results}"))


def _finished(run: Run):
    try:
        status, orphans = run.finish()
    finally:
        run.clean_up()
    return status, orphans, run.stdout.read_text(), run.stderr.read_text()


@pytest.mark.slow
def test_a_disk_that_fills_mid_sweep_is_one_line_keeps_the_first_row_and_resumes(tmp_path, small_fs):
    project = tmp_path / "project"
    project.mkdir()
    install_faults(project)  # the Fault transform, in the user's project
    markers, results = small_fs / "markers", small_fs / "out"  # it fills the file system of its markers
    markers.mkdir()
    (markers / ARMED).touch()

    status, orphans, stdout, stderr = _finished(_sweep(project, markers, results))
    folder = project / results_folder(stdout)
    job_lines = [line for line in stderr.splitlines() if line.startswith("pipebench: error: ")]
    assert status == 2 and orphans == 0, stderr
    assert all(line.startswith(("pipebench: ", "  job ")) for line in stderr.strip().splitlines()), \
        "no traceback, no Hydra line"
    assert job_lines == [f"pipebench: error: {folder / 'job-1' / RESULT_FILE}: {FULL}{folder / 'job-1'})"], stderr
    assert stderr.strip().splitlines()[-1].startswith("pipebench: the tables were not written: "), stderr
    assert [r.summary.workers for r in load_job_results(folder)] == [0], "the first job's row is kept"
    first = hashlib.sha256((folder / "job-0" / RESULT_FILE).read_bytes()).hexdigest()

    (markers / FILLER).unlink()
    (markers / ARMED).unlink()
    status, orphans, stdout, stderr = _finished(_sweep(project, markers, results))
    assert status == 0 and orphans == 0 and "pipebench: error" not in stderr, stderr
    assert "resuming" in stdout and project / results_folder(stdout) == folder
    assert [r.summary.workers for r in load_job_results(folder)] == [0, 1]
    assert hashlib.sha256((folder / "job-0" / RESULT_FILE).read_bytes()).hexdigest() == first


# `dataset convert`'s corpus: 8 JPEGs of about 7 KB; a shard (or chunk) of 4 is 29-51 KB.
CONVERT_CORPUS = ["dataset.num_images=8", "dataset.length=8", "dataset.width=128", "dataset.height=128",
                  "dataset.num_classes=3"]
# Space left for it: more than the first tar shard or LitData chunk, less than two, so the writer stops
# mid-file in the second (a shard without a PAX header a member is about 30 KB).
CONVERT_ROOM = 40 << 10


@pytest.mark.parametrize("to, cut", [("webdataset", "shard-000001.tar"), ("litdata", "chunk-0-1.bin")])
def test_convert_on_a_full_disk_names_the_file_and_the_space_and_leaves_nothing(to, cut, small_fs, tmp_path):
    _leave_room(small_fs, CONVERT_ROOM)
    out = small_fs / "out"
    with pytest.raises(PipebenchError) as full:
        convert(to, out, 4, [*CONVERT_CORPUS, f"dataset.cache_dir={tmp_path / 'cache'}"])
    assert str(full.value).startswith(f"{out / cut}: No space left on device ("), str(full.value)
    assert f" free of {SMALL_FS[:-1]}.0 MiB in {out})" in str(full.value)
    assert sorted(p.name for p in small_fs.iterdir()) == [FILLER], "no half-written shard, no folder"


# Room for a little of the trace of TRACED_OPS matrix products (about 100 KB), not for all of it.
TRACE_ROOM, TRACED_OPS = 16 << 10, 200


def test_a_trace_that_does_not_fit_is_one_line_and_leaves_no_file(small_fs):
    import torch

    from pipebench.measure.after_window import TORCH_TRACE_FILE, _export

    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with profiler:
        for _ in range(TRACED_OPS):
            torch.ones(8, 8) @ torch.ones(8, 8)
    _leave_room(small_fs, TRACE_ROOM)
    with pytest.raises(PipebenchError) as full:
        _export(profiler, small_fs / TORCH_TRACE_FILE)
    assert str(full.value) == f"{small_fs / TORCH_TRACE_FILE}: {FULL}{small_fs})"
    assert sorted(p.name for p in small_fs.iterdir()) == [FILLER], "no empty trace.json, no kineto temporary"
