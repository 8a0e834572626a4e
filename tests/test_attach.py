"""`pipebench attach` and `pipebench.watch` against a script of known costs.

The script's dataset busy-waits FETCH_MS a sample (wall clock, so a shared machine's load does not
change its length) and its step spins STEP_MS; at workers=0 and batch BATCH the truth is
wait = BATCH * FETCH_MS a step, step = STEP_MS, so starvation and samples/s are known.
"""

import re
import textwrap

import pytest
import torch

import pipebench
from pipebench.cli.main import main
from pipebench.measure.watch import batch_samples
from pipebench.record.results import read_result
from pipebench.report.diagnosis import diagnose, prediction_table_rows

FETCH_MS = 1.5
STEP_MS = 12.0
BATCH = 8
STEPS = 60
SKIP = 3
TRUE_WAIT_MS = BATCH * FETCH_MS
TRUE_STARVATION_PCT = 100.0 * TRUE_WAIT_MS / (TRUE_WAIT_MS + STEP_MS)
TRUE_SAMPLES_PER_S = 1000.0 * BATCH / (TRUE_WAIT_MS + STEP_MS)
# The truth tolerances: 5% on a rate, 3 points on starvation.
RATE_TOLERANCE = 0.05
STARVATION_POINTS = 3.0
# A busy-wait row: the spin ends on its deadline, the wrapper's clock reads add microseconds.
ROW_TOLERANCE = 0.1
# The diagnosis explains a measurement within 15% (report/diagnosis.py EXPLAINED_WITHIN).
MODEL_GAP = 0.15

SCRIPT = textwrap.dedent("""
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    FETCH_MS, STEP_MS, EXIT = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])

    class BusyDataset(Dataset):
        def __len__(self):
            return 4000

        def __getitem__(self, i):
            end = time.perf_counter() + FETCH_MS / 1000
            while time.perf_counter() < end:
                pass
            return torch.zeros(3), i

    def make_loader():
        return DataLoader(BusyDataset(), batch_size={batch}, num_workers=0)

    def train(loader, steps):
        for n, (x, y) in enumerate(loader):
            end = time.perf_counter() + STEP_MS / 1000  # a spin, not a sleep: no wake-up late on a busy host
            while time.perf_counter() < end:
                pass
            if n == steps:
                break

    if __name__ == "__main__":
        loader = make_loader()
        train(loader, {steps})
        sys.exit(EXIT)
""").format(batch=BATCH, steps=STEPS + SKIP + 5)
# Where SCRIPT creates its DataLoader: the name attach must give the loader.
LOADER_LINE = next(n for n, line in enumerate(SCRIPT.splitlines(), 1) if "return DataLoader(" in line)


@pytest.fixture()
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def _attach(script, out, exit_status=0):
    return main(["attach", "--steps", str(STEPS), "--skip-steps", str(SKIP), "--out", str(out), "--",
                 "python", str(script), str(FETCH_MS), str(STEP_MS), str(exit_status)])


def _assert_truth(samples_per_s, starvation_pct):
    assert samples_per_s == pytest.approx(TRUE_SAMPLES_PER_S, rel=RATE_TOLERANCE)
    assert starvation_pct == pytest.approx(TRUE_STARVATION_PCT, abs=STARVATION_POINTS)


def test_attach_measures_the_known_costs_and_passes_the_exit_status(script, tmp_path, capsys):
    out = tmp_path / "out"
    assert _attach(script, out, exit_status=3) == 3
    result = read_result(out / "job-0" / "result.json")
    summary = result["summary"]
    _assert_truth(summary["samples_per_s"], summary["starvation_pct"])
    assert summary["steps"] == STEPS
    site = f"train.py:{LOADER_LINE}"
    assert summary["job"] == f"loader={site}"
    assert summary["dataset"] == "BusyDataset" and summary["workers"] == 0
    assert summary["batches_per_s"] == pytest.approx(TRUE_SAMPLES_PER_S / BATCH, rel=RATE_TOLERANCE)
    assert 0 < summary["first_batch_s"] < 1.0
    assert site in capsys.readouterr().out
    assert main(["report", str(out)]) == 0
    # The dataset has no recipe: its whole __getitem__ is the load row, named by its class.
    rows = {r["transform"]: r for r in result["transforms"]}
    assert rows["BusyDataset"]["stage"] == "load" and rows["BusyDataset"]["calls"] == STEPS * BATCH
    assert rows["BusyDataset"]["ms_per_call_median"] == pytest.approx(FETCH_MS, rel=ROW_TOLERANCE)
    # With the load timed, the chain's whole cost is known: the diagnosis models the watched loader.
    diagnosis = (out / "report.md").read_text().split("## diagnosis")[1]
    assert "left out of the model" not in diagnosis and not re.search(r"\bnan\b", diagnosis)
    assert f"Dominant cost in loader={site}: BusyDataset" in diagnosis
    (row,) = prediction_table_rows(diagnose([result]))
    assert abs(row["gap_pct"]) < 100 * MODEL_GAP


def test_watch_in_process_agrees_with_attach(script, tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["train.py", str(FETCH_MS), str(STEP_MS), "0"])
    namespace = {"__name__": "user_script"}
    exec(compile(script.read_text(), str(script), "exec"), namespace)
    watched = pipebench.watch(namespace["make_loader"](), steps=STEPS, skip_steps=SKIP)
    namespace["train"](watched, STEPS + SKIP + 5)
    assert watched.done
    result = watched.result()
    _assert_truth(result.samples_per_s, result.starvation_pct)
    assert result.steps_measured == STEPS
    assert result.samples_per_s_ci[0] <= result.samples_per_s <= result.samples_per_s_ci[1]
    folder = result.save(tmp_path / "watched")
    assert read_result(folder / "job-0" / "result.json")["summary"]["samples_per_s"] == result.samples_per_s
    assert main(["report", str(folder)]) == 0


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


def test_a_script_that_iterates_no_loader_exits_2_with_one_line(tmp_path, capsys):
    script = tmp_path / "idle.py"
    script.write_text("import sys\nprint('hello')\nsys.exit(5)\n")
    out = tmp_path / "out"
    assert main(["attach", "--out", str(out), "--", "python", str(script)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "hello\n"
    assert len(captured.err.strip().splitlines()) == 1 and "iterated no torch.utils.data.DataLoader" in captured.err
    assert "exited 5" in captured.err
    assert not out.exists()


def test_the_patch_is_removed_after_attach_even_when_the_script_fails(tmp_path):
    init, iterate = torch.utils.data.DataLoader.__init__, torch.utils.data.DataLoader.__iter__
    script = tmp_path / "boom.py"
    script.write_text("raise SystemExit('bad')\n")
    assert main(["attach", "--out", str(tmp_path / "out"), "--", str(script)]) == 2
    assert torch.utils.data.DataLoader.__init__ is init and torch.utils.data.DataLoader.__iter__ is iterate


def test_batch_samples_reads_the_batch_and_falls_back_to_batch_size():
    assert batch_samples((torch.zeros(5, 3), torch.zeros(5)), 8) == 5
    assert batch_samples({"image": torch.zeros(6, 3)}, 8) == 6
    assert batch_samples(([torch.zeros(3, 4, 4)] * 7, torch.zeros(7)), 8) == 7  # uncollated images
    assert batch_samples(["a", "b"], 8) == 8
    assert batch_samples(torch.zeros(4), None) == 4


def test_import_pipebench_stays_cheap():
    """`pipebench.watch` is imported on first use: the package itself imports no torch."""
    import subprocess
    import sys

    code = "import sys, pipebench; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
