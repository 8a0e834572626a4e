"""`loader.backend` through the CLI: a bad or uninstalled backend is one line before any job (`main()` in
this process: the command's status and its one line, with no job process to wait for), and a sweep over
the three backends, through the real command, is one table with every figure side by side. Each asserts
on lines and tables, not on a rate, so it runs beside other tests (test_loader_backends.py and
test_backend_figures.py measure, alone)."""

import csv
import sys

import pytest
# Imported, so main() builds the jobs in this process (pipebench.sweep.build_check), where the test
# blocks torchdata and spdl, not in a child of the job process it starts.
import torch  # noqa: F401
from conftest import FAST_JOB, NO_CHAIN, results_folder, run_cli

from pipebench.base.extras import install_line
from pipebench.cli.main import main
from pipebench.report.comparison import BACKEND_COLUMNS

# Every backend, in the order the sweep names them and the table must list them.
SWEPT = ["dataloader", "threads", "spdl"]
# The libraries of the thread backends, made to look uninstalled for the missing-backend case.
UNINSTALLED = ("torchdata", "spdl")


@pytest.mark.slow
@pytest.mark.parametrize("override, line, extras", [
    ("loader.backend=thread", "loader.backend must be one of dataloader, threads, spdl, got 'thread'", ()),
    # The README's backends sweep without either library: both named in one line, one install for both.
    ("loader.backend=dataloader,threads,spdl", "loader.backend=threads needs torchdata; loader.backend=spdl needs "
                                               "spdl: ", ("threads", "spdl")),
])
def test_a_bad_or_missing_backend_is_one_line_exit_2_before_any_job(override, line, extras, tmp_path, monkeypatch,
                                                                    capsys):
    # torchdata and spdl blocked in this process (None in sys.modules, and none of their modules
    # imported): torchdata.nodes and spdl.pipeline cannot be found, as if uninstalled.
    for name in [name for name in sys.modules if name.split(".")[0] in UNINSTALLED]:
        monkeypatch.delitem(sys.modules, name)
    for name in UNINSTALLED:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.chdir(tmp_path)  # the install line's form depends on the working directory, as the command's
    line += install_line(extras) if extras else ""
    # No chain: its builds (torchvision's import, seconds) come before the backends' check.
    status = main(["run", *FAST_JOB, *NO_CHAIN, "workers=2", override, f"results_dir={tmp_path / 'results'}"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert line in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").rglob("result.json"))


@pytest.mark.slow
def test_a_backend_sweep_is_one_table_with_every_figure_side_by_side(user_project):
    # The user's own chain (a module in the working directory) under every backend.
    done = run_cli(["run", "--config-dir", "my_conf", "transform=tiny", *FAST_JOB, "workers=2",
                    f"loader.backend={','.join(SWEPT)}", "results_dir=out"], user_project)
    assert done.returncode == 0, done.stderr[-2000:]
    table = (user_project / results_folder(done.stdout) / "comparison.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    titles = ["samples/s", "spread (95% CI)", "starvation %", *(title for title, _ in BACKEND_COLUMNS.values())]
    assert header[0] == "backend" and set(titles) <= set(header), header
    assert [row[0] for row in rows] == SWEPT
    # summary.csv holds the jobs in the sweep's order, as the table does.
    notes = [job["ci_note"] for job in csv.DictReader((user_project / results_folder(done.stdout) / "summary.csv").open())]
    for row, note in zip(rows, notes, strict=True):
        assert float(row[header.index("samples/s")]) > 0, row
        # A spread, or none where it would say nothing (two quick worker cycles): then the job's note says why.
        spread = row[header.index("spread (95% CI)")]
        assert "–" in spread or (spread == "" and note), (row, note)
        assert all(float(row[header.index(title)]) >= 0 for title in titles if title != "spread (95% CI)"), row
