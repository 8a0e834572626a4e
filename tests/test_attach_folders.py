"""attach's results folder is claimed before the script runs: a name of its own, never another run's
rows, and one line with exit 2 before the script starts when the folder cannot be had. And a script
that fails before any DataLoader is said to have failed, with its own exit status.

Each case checks the one line and the exit status, that the script did not run when it must not
(it writes a marker first thing), and that nothing outside the results folder changed (every
file's checksum before and after).
"""

import csv
import hashlib
import os
import textwrap
import time
from pathlib import Path
from typing import Dict

import pytest

from pipebench.attach.claimed_folder import BUSY_ADVICE, claimed_folder
from pipebench.cli.main import main
from pipebench.record.folder_lock import LOCK_FILE, FolderBusy
from pipebench.record.results import read_result

# The script: a marker first (it ran), then LOADERS loaders of a few batches, then exit STATUS.
SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    import torch
    from torch.utils.data import DataLoader

    Path(sys.argv[1]).write_text("ran")
    for n in range(int(sys.argv[2])):
        for batch in DataLoader(torch.arange(40.0) + n, batch_size=2):
            pass
    sys.exit(int(sys.argv[3]))
""")
WINDOW = ("--steps", "5", "--skip-steps", "1")
# The status the script exits with where it measured something: attach must pass it through.
SCRIPT_STATUS = 3


@pytest.fixture()
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def _attach(project: Path, loaders: int, *flags: str) -> int:
    return main(["attach", *WINDOW, *flags, "--", "python", str(project / "train.py"), str(project / "ran"),
                 str(loaders), str(SCRIPT_STATUS)])


def _tree(root: Path) -> Dict[str, str]:
    """Every file under root (links included, not followed): its path and its content's checksum."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "ran"}


def _rows(folder: Path) -> int:
    with open(folder / "summary.csv", newline="") as f:
        return len(list(csv.DictReader(f)))


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_two_attaches_started_in_one_second_get_a_folder_each(project, monkeypatch, capsys):
    second = time.strftime("%Y-%m-%d_%H-%M-%S")
    monkeypatch.setattr(time, "strftime", lambda *args: second)  # both runs start in the same second
    assert _attach(project, 1) == SCRIPT_STATUS
    assert _attach(project, 2) == SCRIPT_STATUS
    folders = [Path(line.split()[1]) for line in capsys.readouterr().out.splitlines() if line.startswith("results: ")]
    assert folders[0] != folders[1], folders
    assert [_rows(f) for f in folders] == [1, 2]  # neither run's rows lost, nor mixed with the other's


def test_runs_holding_one_name_at_once_are_given_two_folders_and_one_out_is_held_by_one(tmp_path):
    with claimed_folder(None, tmp_path / "t") as first, claimed_folder(None, tmp_path / "t") as second:
        assert (first, second) == (tmp_path / "t", tmp_path / "t-2")
        with pytest.raises(FolderBusy, match="in use by another pipebench run") as busy:
            with claimed_folder(first, tmp_path / "unused"):
                pass
        # attach's own way out (issue 55.4): run's --fresh is no flag of attach's.
        assert f"process {os.getpid()} holds" in str(busy.value) and "--fresh" not in str(busy.value)
        assert str(busy.value).endswith(BUSY_ADVICE)
    assert not first.exists() and not second.exists()  # nothing written: nothing left


def test_an_out_holding_an_earlier_run_is_refused_before_the_script_and_replaced_with_force(project, capsys):
    out = project / "out"
    assert _attach(project, 2, "--out", str(out)) == SCRIPT_STATUS
    (project / "ran").unlink()
    capsys.readouterr()
    before = _tree(project)
    assert _attach(project, 1, "--out", str(out)) == 2
    line = _one_line(capsys.readouterr().err)
    # attach wrote its jobs and, as run does, its report beside them: the line names the first few.
    assert line.startswith(f"pipebench: error: {out} already holds ") and "job-0" in line and "--force" in line
    assert not (project / "ran").exists() and _tree(project) == before  # the script never ran; nothing changed
    assert _attach(project, 1, "--out", str(out), "--force") == SCRIPT_STATUS
    assert sorted(p.name for p in out.glob("job-*")) == ["job-0"] and _rows(out) == 1  # nothing of the old run
    assert read_result(out / "job-0" / "result.json")["summary"]["steps"] == 5
    outside = {name: digest for name, digest in before.items() if not name.startswith("out/")}
    assert {name: digest for name, digest in _tree(project).items() if not name.startswith("out/")} == outside


def test_force_never_empties_a_folder_that_holds_no_results(project, capsys):
    mine = project / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's own")
    assert _attach(project, 1, "--out", str(mine), "--force") == 2
    assert "holds no pipebench results (notes.txt)" in _one_line(capsys.readouterr().err)
    assert not (project / "ran").exists() and (mine / "notes.txt").read_text() == "the user's own"


def test_force_never_removes_a_users_file_beside_results(project, capsys):
    out = project / "out"
    assert _attach(project, 1, "--out", str(out)) == SCRIPT_STATUS
    (out / "train.py").write_text("the user's own")
    capsys.readouterr()
    assert _attach(project, 1, "--out", str(out), "--force") == 2
    assert "also holds train.py, which attach does not write" in _one_line(capsys.readouterr().err)
    assert (out / "train.py").read_text() == "the user's own" and (out / "job-0" / "result.json").exists()


@pytest.mark.parametrize("out, said", [
    ("afile", "--out {project}/afile is a file, not a folder"),
    ("afile/sub", "--out {project}/afile/sub: the results folder cannot be created ({project}/afile/sub: Not a "
                  "directory)"),
], ids=["a file", "a folder in a file"])
def test_an_out_that_cannot_be_a_folder_is_one_line_before_the_script_runs(project, capsys, out, said):
    (project / "afile").write_text("not a folder")
    before = _tree(project)
    assert _attach(project, 1, "--out", str(project / out)) == 2
    assert _one_line(capsys.readouterr().err) == "pipebench: error: " + said.format(project=project)
    assert not (project / "ran").exists() and _tree(project) == before


def test_an_empty_out_is_used_and_left_as_it_was_when_nothing_is_measured(project):
    out = project / "out"
    out.mkdir()
    assert _attach(project, 0, "--out", str(out)) == SCRIPT_STATUS
    assert out.is_dir() and list(out.iterdir()) == []  # no lock file left behind in the user's folder
    assert _attach(project, 1, "--out", str(out)) == SCRIPT_STATUS
    assert _rows(out) == 1 and (out / LOCK_FILE).is_file()


@pytest.mark.parametrize("command, source, status, python_said", [
    (["python", "bad.py"], "x = (\n", 1, "SyntaxError"),
    (["python", "-m", "no_such_module_here"], None, 1, "No module named no_such_module_here"),
    (["python", "bad.py"], "import sys\nsys.exit(5)\n", 5, None),
], ids=["SyntaxError", "no such module", "sys.exit(5)"])
def test_a_script_that_fails_before_any_loader_is_said_to_fail_with_its_status(project, capsys, command, source,
                                                                               status, python_said):
    if source is not None:
        (project / "bad.py").write_text(source)
    assert main(["attach", "--out", "out", "--", *command]) == status
    err = capsys.readouterr().err
    if python_said:
        assert python_said in err
    ours = [line for line in err.splitlines() if line.startswith("pipebench")]
    target = command[-1]
    assert ours == [f"pipebench attach: {target} failed (it exited {status}) before it iterated a "
                    "torch.utils.data.DataLoader: nothing was measured"]
    assert not (project / "out").exists()
