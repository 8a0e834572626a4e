"""A `pipebench run` job's series.csv: its measured steps in windows of whole worker cycles, in the recorder's columns.

The series is cut from per-step data of known truth (a step that turns slow halfway, an epoch's end,
a second repeat), so each row's figures are known; the report draws a run folder's jobs with the
recorder's timeline. One end-to-end run checks that a job writes the file and its report the picture.
"""

import csv

import numpy as np
import pytest
from conftest import FAST_JOB, NO_CHAIN, results_folder

from pipebench.cli.main import main
from pipebench.measure.job_series import SERIES_WINDOWS_A_PASS, job_series, series_window_steps, sink_timings, write_job_series
from pipebench.measure.series_window import SERIES_COLUMNS, SERIES_CSV
from pipebench.measure.steps import TimingSink
from pipebench.report.recorded import JOB_SERIES_PNG, recording_markdown

BATCH = 8
CYCLE = 4
FAST_MS, SLOW_MS = 10.0, 20.0


def _pass(steps: int, slow_from: int, epoch_end: int = 0, wait_ms: float = 1.0):
    """A pass's per-step lists as result.json holds them: every step `FAST_MS` until `slow_from`, then
    `SLOW_MS`; the loader's epoch turns 2 at step index `epoch_end` (none at 0)."""
    return {"samples": [BATCH] * steps, "wait_ms": [wait_ms] * steps,
            "step_ms": [FAST_MS if i < slow_from else SLOW_MS for i in range(steps)],
            "epoch": [2 if epoch_end and i >= epoch_end else 1 for i in range(steps)]}


def _timings(steps: int, slow_from: int):
    """Each step's [samples, 2 sample steps + 1 batch step] ns: Decode turns from 1 to 5 ms a sample
    at `slow_from`; Crop stays 2 ms; the collate is 8 ms a batch, 1 ms a sample."""
    sink = TimingSink()
    for i in range(steps):
        sink.sample_ns.append(np.tile([2e6, 1e6 if i < slow_from else 5e6], (BATCH, 1)))
        sink.batch_ns.append(np.array([8e6]))
    return sink_timings(sink)


def test_a_window_is_whole_cycles_about_twenty_a_pass_at_least_one_cycle():
    assert series_window_steps(400, 4) == 20
    assert series_window_steps(410, 4) == 24  # 20.5 steps rounded up to whole cycles
    assert series_window_steps(10, 4) == 4  # a short pass: one cycle
    assert series_window_steps(45, 1) == 3
    assert series_window_steps(3, 0) == 1  # workers=0: a cycle of one step


def test_a_planted_slowdown_shows_as_a_falling_rate_and_every_step_is_in_one_row():
    steps = 200
    rows = job_series("job-1", 0, [_pass(steps, steps // 2)], CYCLE, ["Crop", "Decode", "default_collate"],
                      _timings(steps, steps // 2))
    size = series_window_steps(steps, CYCLE)
    assert len(rows) == -(-steps // size) <= SERIES_WINDOWS_A_PASS
    covered = [step for row in rows for step in range(row["first_step"], row["last_step"] + 1)]
    assert covered == list(range(1, steps + 1))
    assert sum(row["steps"] for row in rows) == steps and sum(row["samples"] for row in rows) == steps * BATCH
    early, late = rows[:len(rows) // 2 - 1], rows[len(rows) // 2 + 1:]
    assert all(row["samples_per_s"] == pytest.approx(BATCH * 1000 / FAST_MS) for row in early)
    assert all(row["samples_per_s"] == pytest.approx(BATCH * 1000 / SLOW_MS) for row in late)
    assert all(row["starvation_pct"] == pytest.approx(100 * 1.0 / SLOW_MS) for row in late)
    assert rows[-1]["t_end_s"] == pytest.approx((steps // 2) * (FAST_MS + SLOW_MS) / 1000)
    # The step that grew leads the later rows, at its planted cost; Crop led while Decode was cheap.
    assert (early[0]["top_step_1"], early[0]["top_step_1_ms"]) == ("Crop", pytest.approx(2.0))
    assert (late[0]["top_step_1"], late[0]["top_step_1_ms"]) == ("Decode", pytest.approx(5.0))
    assert late[0]["top_step_3"] == "default_collate" and late[0]["top_step_3_ms"] == pytest.approx(1.0)
    assert rows[0]["wait_p50_ms"] == pytest.approx(1.0, rel=0.02)  # the sketch's 1%


def test_no_window_spans_an_epochs_end_and_each_repeat_starts_an_epoch():
    passes = [_pass(40, 40, epoch_end=30), _pass(40, 40)]
    rows = job_series("job-1", 0, passes, CYCLE)
    assert [(row["first_step"], row["last_step"], row["epoch"]) for row in rows][:9] == [
        (1, 4, 1), (5, 8, 1), (9, 12, 1), (13, 16, 1), (17, 20, 1), (21, 24, 1), (25, 28, 1), (29, 30, 1),
        (31, 34, 2)]
    assert rows[-1]["last_step"] == 80 and rows[-1]["epoch"] == 3
    assert [row["first_step"] for row in rows if row["epoch"] == 3][0] == 41
    assert "top_step_1" not in rows[0]  # no timings: no top steps


def test_timings_that_do_not_match_the_steps_name_no_top_step():
    rows = job_series("job-1", 0, [_pass(20, 20)], CYCLE, ["Crop", "Decode", "default_collate"], _timings(19, 20))
    assert rows and all("top_step_1" not in row for row in rows)


def test_the_file_has_the_recorders_columns_and_the_report_draws_each_job(tmp_path, capsys):
    for num, slow_from in ((1, 48), (2, 100)):  # job-1: the whole second half of its windows slow
        job_dir = tmp_path / f"job-{num}"
        job_dir.mkdir()
        write_job_series(job_dir, job_series(job_dir.name, 0, [_pass(100, slow_from)], CYCLE))
    with open(tmp_path / "job-1" / SERIES_CSV, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == SERIES_COLUMNS
    assert rows[0]["loader"] == "job-1" and rows[0]["stall"] == "" and rows[0]["top_step_1"] == ""
    assert rows[0]["recorder_pct"] == ""  # the recorder's own share: no recorder in a job
    section = recording_markdown([tmp_path], tmp_path)
    assert (tmp_path / JOB_SERIES_PNG.format(suffix="")).stat().st_size > 0
    lines = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| job-")}
    assert "-50.0" in lines["job-1"] and "| 0.0 " in lines["job-2"], section
    # A folder it cannot write into: one warning line, and the job goes on.
    write_job_series(tmp_path / "missing", [])
    err = capsys.readouterr().err
    assert err.startswith("pipebench: series.csv not written: ") and len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_a_run_job_writes_its_series_and_the_run_report_draws_it(tmp_path, capsys):
    # In this process, through `main`: the test reads the run's files, and a console script would pay
    # the interpreter and the verb's imports again.
    status = main(["run", *FAST_JOB, *NO_CHAIN, f"results_dir={tmp_path / 'out'}"])
    out, err = capsys.readouterr()
    assert status == 0, err
    folder = results_folder(out)
    with open(folder / "job-0" / SERIES_CSV, newline="") as f:  # Hydra numbers a sweep's jobs from 0
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == SERIES_COLUMNS and rows
    assert rows[0]["first_step"] == "1" and all(float(row["samples_per_s"]) > 0 for row in rows)
    assert [int(r["first_step"]) for r in rows[1:]] == [int(r["last_step"]) + 1 for r in rows[:-1]]
    assert (folder / JOB_SERIES_PNG.format(suffix="")).stat().st_size > 0
    assert "## Job series" in (folder / "report.md").read_text()
