"""`pipebench attach` and `pipebench.watch` around a script's end: its exit status and traceback kept,
one line for a script that iterates no loader, the DataLoader patch removed, and a script that exits
with a watched epoch open exits. Nothing here reads a rate, so these tests share the cores, apart
from test_attach.py's known-cost ones, which run alone."""

import subprocess
import sys
import textwrap

import pytest
import torch

from pipebench.cli.main import main
from pipebench.record.results import read_result

# A script of three steps starts torch and exits in a few seconds; one that hangs at exit never does.
EXIT_TIMEOUT_S = 60


def test_a_failing_script_keeps_its_traceback_status_and_measurement(tmp_path, capsys):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader
        for n, batch in enumerate(DataLoader(torch.arange(400.0), batch_size=4)):
            if n == 20:
                raise RuntimeError("the user's own bug")
    """))
    out = tmp_path / "out"
    assert main(["attach", "--skip-steps", "2", "--out", str(out), "--", str(script)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "RuntimeError: the user's own bug" in err
    assert "runpy" not in err and "attach.py" not in err
    assert read_result(out / "job-0" / "result.json")["summary"]["steps"] == 17  # 20 - first batch - 2 skipped


@pytest.mark.parametrize("exit_status, status, said", [
    (0, 2, "iterated no torch.utils.data.DataLoader (it exited 0)"),
    (5, 5, "failed (it exited 5) before it iterated a torch.utils.data.DataLoader"),  # a failure keeps its status
])
def test_a_script_that_iterates_no_loader_gets_one_line(tmp_path, capsys, exit_status, status, said):
    script = tmp_path / "idle.py"
    script.write_text(f"import sys\nprint('hello')\nsys.exit({exit_status})\n")
    out = tmp_path / "out"
    assert main(["attach", "--out", str(out), "--", "python", str(script)]) == status
    captured = capsys.readouterr()
    assert captured.out == "hello\n"
    assert len(captured.err.strip().splitlines()) == 1 and said in captured.err
    assert not out.exists()


def test_the_patch_is_removed_after_attach_even_when_the_script_fails(tmp_path):
    init, iterate = torch.utils.data.DataLoader.__init__, torch.utils.data.DataLoader.__iter__
    script = tmp_path / "boom.py"
    script.write_text("raise SystemExit('bad')\n")
    assert main(["attach", "--out", str(tmp_path / "out"), "--", str(script)]) == 1
    assert torch.utils.data.DataLoader.__init__ is init and torch.utils.data.DataLoader.__iter__ is iterate


@pytest.mark.slow
def test_a_script_that_exits_with_a_watched_epoch_open_exits(tmp_path):
    script = tmp_path / "open_epoch.py"
    script.write_text(textwrap.dedent("""
        import torch, pipebench
        from torch.utils.data import DataLoader
        watched = pipebench.watch(DataLoader(torch.arange(100.0), batch_size=2), steps=5, skip_steps=0)
        batches = iter(watched)  # a global: its epoch is closed at interpreter exit, inside the window
        for _ in range(3):
            next(batches)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=EXIT_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
