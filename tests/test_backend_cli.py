"""`loader.backend` through the real CLI: a bad or uninstalled backend is one line before any job, and a
sweep over the three backends is one table with every figure side by side. Each asserts on lines and
tables, not on a rate, so it runs beside other tests (test_loader_backends.py and
test_backend_figures.py measure, alone)."""

import csv
import os

import pytest
from conftest import FAST_JOB, results_folder, run_cli

from pipebench.base.extras import install_line
from pipebench.report.comparison import BACKEND_COLUMNS

# Every backend, in the order the sweep names them and the table must list them.
SWEPT = ["dataloader", "threads", "spdl"]


@pytest.mark.slow
@pytest.mark.parametrize("override, line, extras", [
    ("loader.backend=thread", "loader.backend must be one of dataloader, threads, spdl, got 'thread'", ()),
    # The README's backends sweep without either library: both named in one line, one install for both.
    ("loader.backend=dataloader,threads,spdl", "loader.backend=threads needs torchdata; loader.backend=spdl needs "
                                               "spdl: ", ("threads", "spdl")),
])
def test_a_bad_or_missing_backend_is_one_line_exit_2_before_any_job(override, line, extras, tmp_path, monkeypatch):
    # Modules named torchdata and spdl that are no packages: torchdata.nodes and spdl.pipeline cannot
    # be found, as if uninstalled.
    (tmp_path / "torchdata.py").write_text("")
    (tmp_path / "spdl.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.chdir(tmp_path)  # the install line's form depends on the working directory, as the command's
    line += install_line(extras) if extras else ""
    done = run_cli(["run", *FAST_JOB, "workers=2", override, f"results_dir={tmp_path / 'results'}"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert line in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
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
