"""Comparison table, plots and `pipebench report`, on constructed results and the committed nightly baseline."""

import csv
import json
import math
import shutil
import struct
import warnings
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np
import pytest
from torch.utils.benchmark.utils.common import Measurement, TaskSpec

from pipebench.base.errors import ConfigError
from pipebench.base.noise_figures import (
    compare_half_width,
    format_column,
    significant_figures,
)
from pipebench.cli.main import main
from pipebench.model.judging import ROUNDS_SPREAD
from pipebench.record.jobs import JobResult, override_pairs
from pipebench.report.comparison import BEST_MARK, NEAR_BEST_MARK, build_table, comparison_markdown, group_rows, swept_axes
from pipebench.report.plots import (
    THROUGHPUT_PNG,
    THROUGHPUT_TITLE,
    TRANSFORMS_PNG,
    TRANSFORMS_TITLE,
    throughput_figure,
    transforms_figure,
    write_plots,
)
from pipebench.report.writer import (
    COMPARISON_CSV,
    COMPARISON_MD,
    REPORT_MD,
    load_runs,
    write_report,
)
from stored_results import transform_row

REPO = Path(__file__).resolve().parents[1]
NIGHTLY = REPO / "results" / "baselines" / "AMD_EPYC-2c" / "nightly"
NIGHTLY_JOBS, NIGHTLY_ROUNDS = 8, 5
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _result(num: int, overrides: Sequence[str], rate: float, half_width: float, starvation: float = 50.0,
            workers: int = 0, transform: str = "chain", host: str = "box") -> JobResult:
    label = ",".join(sorted(overrides))
    return JobResult.from_stored({
        "job": label, "job_num": num, "overrides": list(overrides),
        "config": {"workers": workers, "loader": {"batch_size": 32, "pin_memory": True}},
        "choices": {"transform": transform, "dataset": "random_tensors"},
        "summary": {"job": label, "dataset": "random_tensors", "transform": transform, "workers": workers,
                    "batch_size": 32, "consumer": "emulated", "samples_per_s": rate,
                    "samples_per_s_ci_low": rate - half_width, "samples_per_s_ci_high": rate + half_width,
                    "starvation_pct": starvation},
        "transforms": [transform_row("Work", 1000.0 / rate)],
        "fingerprint": {"hostname": host, "cpu_model": "cpu", "usable_cores": 2, "gpu": None},
    })


def _table_cells(markdown: str) -> List[List[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[:1] + lines[2:]]


def _column(markdown: str, title: str) -> List[str]:
    header, *rows = _table_cells(markdown)
    return [row[header.index(title)] for row in rows]


@pytest.mark.parametrize("value, half_width, figures", [
    (242.0, 5.5, 3),      # noise in the units: keep them
    (242.0, 40.0, 2),     # noise in the tens: 240
    (242.0, 12.0, 3),     # 12 keeps two digits (PDG rule), so the units stay
    (154.0, 107.0, 2),    # 150, not the 200 a one-digit rule gives
    (1234.5, 0.01, 4),    # never more than four
    (5.0, 20.0, 1),       # noise larger than the value: still one figure
    (0.0123, 0.0004, 3),
    (100.0, float("nan"), 4),  # unknown noise: the most Compare ever shows
])
def test_significant_figures_follow_the_noise(value, half_width, figures):
    assert significant_figures(value, half_width) == figures


def test_columns_share_the_fewest_earned_decimals():
    cells, decimals = format_column([1.2345, 10.987, 0.5], [4, 2, 3])
    assert decimals == 0 and cells == ["1", "11", "0"]  # 10.987 +- ~0.5 earned no decimals
    cells, decimals = format_column([1.2345, 1.9876], [4, 3])
    assert decimals == 2 and cells == ["1.23", "1.99"]


def test_compare_half_width_is_torch_compares_interval():
    rng = np.random.default_rng(1)
    for n, spread in [(5, 0.01), (9, 0.05), (40, 0.2)]:
        times = list(1e-3 * (1 + spread * rng.standard_normal(n)))
        measurement = Measurement(1, times, TaskSpec("pass", "pass"))
        half_width = compare_half_width(times)
        assert min(max(math.floor(math.log10(measurement.median / half_width)), 1), 4) == \
            measurement.significant_figures


def test_table_rounds_each_row_to_its_own_noise():
    results = [_result(0, ["workers=0"], 1234.4, 0.3), _result(1, ["workers=2"], 1234.4, 40.0, workers=2)]
    table = build_table(group_rows([(Path("run"), results)]))
    markdown = comparison_markdown(table)
    assert _column(markdown, "samples/s") == ["1234", "1230"]
    assert _column(markdown, "spread (95% CI)") == ["1234–1235", "1194–1274"]


def test_a_single_job_is_named_by_its_fields_without_speedup_or_best():
    overrides = ["dataset=random_tensors", "dataset.shape=[3,32,32]", "loader.batch_size=32", "workers=4"]
    table = build_table(group_rows([(Path("run"), [_result(0, overrides, 253.2, 0.9, workers=4)])]))
    markdown = comparison_markdown(table)
    header, row = _table_cells(markdown)
    assert header == ["dataset", "transform", "workers", "batch_size", "consumer", "samples/s", "spread (95% CI)",
                      "starvation %"]
    assert row[:5] == ["random_tensors", "chain", "4", "32", "emulated"]
    assert "speedup" not in markdown and BEST_MARK not in markdown and "dataset.shape" not in markdown


def _sweep_results() -> List[Dict[str, object]]:
    rates = {("a", 0): (100.0, 2.0), ("a", 2): (180.0, 5.0), ("b", 0): (150.0, 3.0), ("b", 2): (185.0, 20.0)}
    return [_result(i, ["suite=fixed", f"transform={t}", f"workers={w}", "results_dir=out"], rate, hw,
                    starvation=90.0 - w * 10, workers=w, transform=t)
            for i, ((t, w), (rate, hw)) in enumerate(rates.items())]


def test_axis_columns_are_the_overrides_that_differ():
    rows = group_rows([(Path("run"), _sweep_results())])
    assert swept_axes(rows) == ("transform", "workers")  # suite is constant, results_dir never an axis
    header = _table_cells(comparison_markdown(build_table(rows)))[0]
    assert header[:2] == ["transform", "workers"] and "suite" not in header and "job" not in header
    # Hydra's sweeper writes booleans back as True/False; the table spells them as configs do.
    assert override_pairs(["loader.pin_memory=True", "run.round=3", "hydra.verbose=true"]) == {
        "loader.pin_memory": "true"}


def test_best_row_marked_and_near_best_within_noise():
    markdown = comparison_markdown(build_table(group_rows([(Path("run"), _sweep_results())])))
    # b,2 (185 +- 20) is best; a,2 (180 +- 5) overlaps it; the workers=0 rows do not.
    assert _column(markdown, "best") == ["", NEAR_BEST_MARK, "", BEST_MARK]


def test_baseline_selection_by_key_value_pairs():
    rows = group_rows([(Path("run"), _sweep_results())])
    assert build_table(rows).baseline == 0
    table = build_table(rows, "transform=b,workers=0")
    assert table.baseline == 2 and table.speedup(2) == 1.0
    # a,2 (180 +- 5 against 150 +- 3) earns two decimals (1.20 +- 0.041), and the column shares them.
    assert _column(comparison_markdown(table), "speedup") == ["0.67", "1.20", "1.00", "1.23"]
    assert "against `transform=b,workers=0`" in comparison_markdown(table)
    with pytest.raises(ConfigError, match="matches 2 jobs, not 1.*transform=a,workers=0"):
        build_table(rows, "workers=0")
    with pytest.raises(ConfigError, match="matches 0 jobs"):
        build_table(rows, "workers=8")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        build_table(rows, "fast")


def test_rounds_make_one_row_with_median_and_iqr():
    rows = group_rows([(NIGHTLY, load_runs([str(NIGHTLY)])[0].results)])
    assert len(rows) == NIGHTLY_JOBS and all(r.rounds == NIGHTLY_ROUNDS for r in rows)
    table = build_table(rows)
    assert table.axes == ("transform", "workers"), "the round is not a swept axis"
    first = rows[0]
    rates = [r.summary.samples_per_s for r in first.results]
    assert first.rate.value == pytest.approx(np.median(rates)) and first.rate.kind == ROUNDS_SPREAD
    assert (first.rate.low, first.rate.high) == pytest.approx(tuple(np.percentile(rates, [25, 75])))
    assert _column(comparison_markdown(table), "rounds") == [str(NIGHTLY_ROUNDS)] * NIGHTLY_JOBS


def _png_size(path: Path) -> tuple:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plots_are_pngs_with_titles_and_units(tmp_path):
    table = build_table(group_rows([(NIGHTLY, load_runs([str(NIGHTLY)])[0].results)]))
    throughput, transforms = throughput_figure(table), transforms_figure(table)
    assert throughput.get_suptitle() == THROUGHPUT_TITLE and transforms.get_suptitle() == TRANSFORMS_TITLE
    rate_axes, starvation_axes = throughput.axes
    assert "samples/s" in rate_axes.get_ylabel() and "%" in starvation_axes.get_ylabel()
    assert "workers" in starvation_axes.get_xlabel()
    assert len(rate_axes.get_legend().get_texts()) == 4, "one line per variant"
    assert "ms" in transforms.axes[0].get_ylabel() and "workers=0" in transforms.axes[0].get_title()
    outcomes = write_plots(table, tmp_path)
    assert all(o.written for o in outcomes)
    for name in (THROUGHPUT_PNG, TRANSFORMS_PNG):
        width, height = _png_size(tmp_path / name)
        assert width >= 400 and height >= 300


def test_throughput_plot_skipped_for_one_worker_count(tmp_path):
    table = build_table(group_rows([(Path("run"), [r for r in _sweep_results() if r.summary.workers == 0])]))
    assert "two worker counts" in throughput_figure(table)
    skipped, written = write_plots(table, tmp_path)[:2]
    assert not skipped.written and written.written and not (tmp_path / THROUGHPUT_PNG).exists()


def _copy_results(source: Path, target: Path, hostname: str) -> Path:
    for path in source.glob("job-*/result.json"):
        record = json.loads(path.read_text())
        record["fingerprint"]["hostname"] = hostname
        (target / path.parent.name).mkdir(parents=True)
        (target / path.parent.name / "result.json").write_text(json.dumps(record))
    return target


def _csv(path: Path) -> List[Dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_report_merges_folders_from_two_hosts(tmp_path, capsys):
    here = _copy_results(NIGHTLY, tmp_path / "here", "ci-runner")
    there = _copy_results(NIGHTLY, tmp_path / "there", "laptop")
    out = tmp_path / "merged"
    assert main(["report", str(here), str(there), "--out", str(out), "--baseline", "host=laptop,workers=0,"
                 "transform=yuv_mask"]) == 0
    rows = _csv(out / COMPARISON_CSV)
    assert len(rows) == 2 * NIGHTLY_JOBS and {r["host"] for r in rows} == {"ci-runner", "laptop"}
    assert [r["baseline"] for r in rows].count("True") == 1 and rows[NIGHTLY_JOBS]["baseline"] == "True"
    header = _table_cells((out / COMPARISON_MD).read_text())[0]
    assert header[:3] == ["host", "transform", "workers"]
    report = (out / REPORT_MD).read_text()
    assert "## Comparison" in report and f"]({THROUGHPUT_PNG})" in report and "different machines" in report
    assert (out / COMPARISON_MD).read_text() in capsys.readouterr().out


def test_report_keeps_same_host_runs_apart(tmp_path):
    first = _copy_results(NIGHTLY, tmp_path / "monday", "box")
    second = _copy_results(NIGHTLY, tmp_path / "tuesday", "box")
    inputs = write_report([str(first), str(second)], tmp_path / "out")
    assert inputs.table.axes[0] == "run" and "host" not in inputs.table.axes
    assert {r["run"] for r in _csv(tmp_path / "out" / COMPARISON_CSV)} == {"monday", "tuesday"}


def test_report_bad_input_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for args in (["report", str(tmp_path / "missing")], ["report", str(tmp_path / "empty")],
                 ["report", str(NIGHTLY), str(NIGHTLY), "--out", str(tmp_path / "x")],
                 ["report", str(NIGHTLY), str(tmp_path / "empty")]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("pipebench: error: ")
    shutil.copytree(NIGHTLY, tmp_path / "copy")
    assert main(["report", str(tmp_path / "copy"), "--baseline", "workers=9"]) == 2


def test_report_ends_with_the_diagnosis(tmp_path):
    """The committed nightly baseline: report.md carries the model beside the measurement and the advice."""
    write_report([str(NIGHTLY)], tmp_path)
    text = (tmp_path / REPORT_MD).read_text()
    assert "## diagnosis" in text and "### what to do" in text
    assert "Dominant cost in transform=yuv_mask: RandomMask" in text
    assert "predicted_samples_per_s" in text


# A step named as a long custom transform's import path: wider in a legend than the figure itself.
LONG_STEP = "per_sample/" + "my_project.augmentations.colour.RandomisedPhotometricDistortion" * 3


def test_a_long_legend_label_wraps_and_the_layout_still_applies(tmp_path, monkeypatch):
    from pipebench.report import plots

    results = [JobResult.from_stored({**r.to_json(), "transforms": [transform_row(LONG_STEP[11:], 5.0)]})
               for r in _sweep_results()]
    table = build_table(group_rows([(Path("run"), results)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "constrained_layout not applied" is a UserWarning
        assert all(o.written for o in write_plots(table, tmp_path)[:2])
    assert max(len(line) for text in transforms_figure(table).axes[0].get_legend().get_texts()
               for line in text.get_text().splitlines()) <= plots.LEGEND_LINE_CHARS
    monkeypatch.setattr(plots, "_legend", lambda label: label)  # unwrapped, the legend outgrows the figure
    with pytest.warns(UserWarning, match="constrained_layout not applied"):
        write_plots(table, tmp_path)
