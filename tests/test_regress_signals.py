"""The one rule for "is it real?", the CPU-time signal beside throughput, Holm across jobs, short
labels, and the per-machine history: synthetic results folders with known figures."""

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest
from stored_results import result_record, write_record

from pipebench.base.significance import DOWN, NO_CHANGE, NOISY, UP, holm, measure_change, separated
from pipebench.cli.compare import compare_main
from pipebench.regress.compare import (
    EXIT_OK,
    EXIT_REGRESSION,
    SIGNAL_BOTH,
    SIGNAL_CPU,
    SIGNAL_WALL,
    SLOWER,
    WALL_ONLY,
    compare_runs,
    load_run,
    render_markdown,
)
from pipebench.regress.history import HistoryRow, append_rows, find_steps, load_history

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

BASE_RATE, BASE_CPU = 1000.0, 2.0  # samples/s, CPU ms a sample
ROUNDS = 5


def write_rounds(folder: Path, jobs: dict, suite: Sequence[str] = ("suite=nightly", "run.steps=15")) -> Path:
    """One result.json a round a job: jobs maps an override list (tuple) to (rates, cpu ms) per round."""
    num = 0
    for overrides, (rates, cpus) in jobs.items():
        for k, (rate, cpu) in enumerate(zip(rates, cpus)):
            full = [f"run.round={k}", *suite, *overrides]
            write_record(folder, result_record(num, overrides=full, rates=[rate], summary={"cpu_ms_per_sample": cpu},
                                               config={"run": {"round": k}}, job=",".join(full)))
            num += 1
    (folder / "summary.csv").write_text("job\n")
    return folder


def jittered(rng, value: float, cv: float, n: int = ROUNDS) -> list:
    return list(value * (1 + cv * rng.standard_normal(n)))


def test_rule_calls_a_real_change_and_not_noise():
    rng = np.random.default_rng(0)
    base = jittered(rng, 100, 0.02)
    assert measure_change(base, [v * 1.2 for v in base], 0.1, paired=True).direction(0.001) == UP
    change = measure_change(base, [v * 0.8 for v in jittered(rng, 100, 0.02)], 0.1)
    assert change.direction(change.p_value) == DOWN
    same = measure_change(base, jittered(rng, 100, 0.02), 0.1)
    assert same.direction(same.p_value) == NO_CHANGE
    wild = measure_change(jittered(rng, 100, 0.3), jittered(rng, 100, 0.3), 0.1)
    assert wild.direction(wild.p_value) == NOISY
    # Three a side is too few for any verdict (MIN_SAMPLES), however large the change.
    three = measure_change([1, 1.01, 0.99], [2, 2.01, 1.99], 0.1)
    assert three.direction(three.p_value) == NOISY


def test_holm_is_step_down_and_keeps_nan():
    adjusted = holm([0.01, 0.04, float("nan"), 0.03])
    assert adjusted[0] == pytest.approx(0.03) and adjusted[3] == pytest.approx(0.06)
    assert adjusted[1] == pytest.approx(0.06) and math.isnan(adjusted[2])


def test_separated_needs_rounds_and_a_real_gap():
    assert separated([10, 10.1, 9.9, 10.05], [12, 12.1, 11.9, 12.05])
    assert not separated([10, 11, 9, 10.5], [10.2, 9.8, 10.1, 10.4])
    assert not separated([10], [20])


def test_more_expensive_chain_shows_in_cpu_time_while_wall_swings_hide_it(tmp_path, capsys):
    """Chain +20% CPU a sample; the wall-clock rounds swing 15% (a busy shared runner): CPU calls it."""
    rng = np.random.default_rng(1)
    base = write_rounds(tmp_path / "base", {("workers=2",): (jittered(rng, BASE_RATE, 0.15), jittered(rng, BASE_CPU, 0.01))})
    head = write_rounds(tmp_path / "head", {("workers=2",): (jittered(rng, BASE_RATE / 1.2, 0.15),
                                                             jittered(rng, BASE_CPU * 1.2, 0.01))})
    job = compare_runs(load_run(str(base)), load_run(str(head))).jobs[0]
    assert job.cpu_verdict == SLOWER and job.wall_verdict != SLOWER
    assert job.verdict == SLOWER and job.flagged_by == SIGNAL_CPU
    assert compare_main(str(base), str(head)) == EXIT_REGRESSION
    assert "| slower | cpu |" in capsys.readouterr().out


def test_slower_host_is_wall_only_not_a_pipeline_regression(tmp_path, capsys):
    """The host 25% slower (wall), CPU time a sample held: `wall only`, exit 0."""
    rng = np.random.default_rng(2)
    base = write_rounds(tmp_path / "base", {("workers=0",): (jittered(rng, BASE_RATE, 0.01), jittered(rng, BASE_CPU, 0.01))})
    head = write_rounds(tmp_path / "head", {("workers=0",): (jittered(rng, BASE_RATE * 0.75, 0.01),
                                                             jittered(rng, BASE_CPU, 0.01))})
    job = compare_runs(load_run(str(base)), load_run(str(head))).jobs[0]
    assert job.wall_verdict == SLOWER and job.cpu_verdict == "no change"
    assert job.verdict == WALL_ONLY and job.flagged_by == SIGNAL_WALL
    assert compare_main(str(base), str(head)) == EXIT_OK
    assert "| wall only | wall |" in capsys.readouterr().out


def test_both_signals_flag_a_clean_slowdown(tmp_path):
    rng = np.random.default_rng(3)
    base = write_rounds(tmp_path / "base", {("workers=0",): (jittered(rng, BASE_RATE, 0.01), jittered(rng, BASE_CPU, 0.01))})
    head = write_rounds(tmp_path / "head", {("workers=0",): (jittered(rng, BASE_RATE / 1.3, 0.01),
                                                             jittered(rng, BASE_CPU * 1.3, 0.01))})
    job = compare_runs(load_run(str(base)), load_run(str(head)), paired=True).jobs[0]
    assert job.verdict == SLOWER and job.flagged_by == SIGNAL_BOTH


def test_folder_without_cpu_time_compares_on_throughput_alone(tmp_path):
    rng = np.random.default_rng(4)
    nan = [float("nan")] * ROUNDS
    base = write_rounds(tmp_path / "base", {("workers=0",): (jittered(rng, BASE_RATE, 0.01), nan)})
    head = write_rounds(tmp_path / "head", {("workers=0",): (jittered(rng, BASE_RATE * 0.75, 0.01),
                                                             jittered(rng, BASE_CPU, 0.01))})
    comparison = compare_runs(load_run(str(base)), load_run(str(head)))
    assert not comparison.cpu_signal and comparison.jobs[0].verdict == SLOWER
    notes = [line for line in render_markdown(comparison).splitlines() if "throughput alone" in line]
    assert len(notes) == 1


def test_holm_across_jobs_keeps_a_borderline_job_from_flagging(tmp_path):
    """A CPU change of 20% at 9% CV (p 0.016): flagged alone, but among 8 jobs Holm asks p < 0.05/8."""
    rng = np.random.default_rng(6)
    cpu_base = [BASE_CPU * f for f in (1.0, 1.12, 0.88, 1.06, 0.94)]
    cpu_head = [BASE_CPU * 1.2 * f for f in (0.88, 1.12, 1.0, 0.94, 1.06)]
    rates = [BASE_RATE] * ROUNDS
    single = compare_runs(load_run(str(write_rounds(tmp_path / "b1", {("workers=0",): (rates, cpu_base)}))),
                          load_run(str(write_rounds(tmp_path / "h1", {("workers=0",): (rates, cpu_head)}))))
    others = {(f"workers={w}",): (rates, jittered(rng, BASE_CPU, 0.01)) for w in range(1, 8)}
    many = compare_runs(load_run(str(write_rounds(tmp_path / "b8", {("workers=0",): (rates, cpu_base), **others}))),
                        load_run(str(write_rounds(tmp_path / "h8", {("workers=0",): (rates, cpu_head), **others}))))
    lone = single.jobs[0]
    among = next(j for j in many.jobs if j.job == "workers=0")
    assert lone.cpu_p_value < 0.05 and lone.verdict == SLOWER
    assert among.cpu_p_value == pytest.approx(8 * lone.cpu_p_value) and among.verdict != SLOWER


def test_labels_keep_only_the_overrides_that_tell_jobs_apart(tmp_path):
    rates, cpus = [BASE_RATE] * ROUNDS, [BASE_CPU] * ROUNDS
    jobs = {("transform=a", "workers=0"): (rates, cpus), ("transform=a", "workers=2"): (rates, cpus),
            ("transform=b", "workers=0"): (rates, cpus)}
    folder = write_rounds(tmp_path / "r", jobs, suite=("suite=nightly", "run.min_time_s=3", "run.progress=False"))
    labels = [j.job for j in compare_runs(load_run(str(folder)), load_run(str(folder))).jobs]
    assert sorted(labels) == ["transform=a,workers=0", "transform=a,workers=2", "transform=b,workers=0"]


def _row(i: int, commit: str, cpu: float, rate: float = 100.0) -> HistoryRow:
    return HistoryRow(f"2026-11-{i + 1:02d}", commit, "base", "m", "workers=0", 5, rate, rate * 0.98, rate * 1.02,
                      cpu, cpu * 0.99, cpu * 1.01, "no change", "")


def test_history_survives_a_torn_and_a_malformed_row(tmp_path):
    path = tmp_path / "m" / "history.csv"
    append_rows(path, [_row(i, f"c{i}", 2.0) for i in range(3)])
    append_rows(path, [_row(3, "c3", 2.0)])
    with path.open("a") as f:
        f.write("2026-11-09,c9,base,m,workers=0,five,1,1,1,1,1,1,no change,\n")  # malformed: rounds
        f.write("2026-11-10,c10,base,m,work")  # torn: a crash mid-write
    history = load_history(path)
    assert [r.commit for r in history.rows] == ["c0", "c1", "c2", "c3"]
    assert len(history.damaged) == 2
    assert "line 6" in history.damaged[0] and "line 7" in history.damaged[1] and "torn" in history.damaged[1]
    # The next night's append starts a line of its own: its row is whole, the torn one stays named.
    append_rows(path, [_row(4, "c4", 2.0)])
    after = load_history(path)
    assert [r.commit for r in after.rows][-2:] == ["c3", "c4"] and len(after.damaged) == 2


def test_history_finds_the_step_and_names_the_first_commit_after_it(tmp_path):
    rng = np.random.default_rng(7)
    cpus = [*jittered(rng, 2.0, 0.01, 6), *jittered(rng, 2.5, 0.01, 6)]
    path = append_rows(tmp_path / "history.csv", [_row(i, f"c{i}", cpu) for i, cpu in enumerate(cpus)])
    steps = find_steps(load_history(path))
    assert [(s.commit, s.job) for s in steps] == [("c6", "workers=0")]
    assert steps[0].after / steps[0].before == pytest.approx(1.25, rel=0.05)
    flat = append_rows(tmp_path / "flat.csv", [_row(i, f"c{i}", c) for i, c in enumerate(jittered(rng, 2.0, 0.01, 12))])
    assert find_steps(load_history(flat)) == []


def test_history_verb_plots_each_job_and_names_the_step(tmp_path, capsys):
    from pipebench.cli.main import main

    rng = np.random.default_rng(8)
    rows = [_row(i, f"c{i}", cpu) for i, cpu in enumerate([*jittered(rng, 2.0, 0.01, 5), *jittered(rng, 2.6, 0.01, 5)])]
    path = append_rows(tmp_path / "m" / "history.csv", rows)
    with path.open("a") as f:
        f.write("garbage\n")
    assert main(["history", str(path), "--out", str(tmp_path / "plots")]) == 0
    captured = capsys.readouterr()
    assert "first commit after it: c5" in captured.out and "line 12" in captured.err
    assert (tmp_path / "plots" / "trend-workers0.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["history", str(tmp_path / "missing.csv")]) == 2
