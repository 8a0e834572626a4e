"""The readers' typed summary: figures typed, missing columns None, and old result folders still load."""

import dataclasses
import json
from typing import Optional

import pytest
from stored_results import result_record, write_record

from pipebench.record.figures import SUMMARY_COLUMNS, SUMMARY_TABLE, Summary
from pipebench.record.jobs import JobResult
from pipebench.record.results import load_job_results
from pipebench.report.diagnosis import chain_costs, diagnose

# What an early pipebench wrote: no schema_version, no choices, and a summary without the columns
# added since (ranks, the epoch rate, syncs, accel_util_pct...).
EARLY_SUMMARY_LEFT_OUT = ("ranks", "straggler_ratio", "collective_wait_ms_mean", "samples_per_s_epoch",
                          "epoch_restart_s", "accel_util_pct", "syncs_per_step")


def test_a_row_without_columns_reads_them_as_none():
    summary = Summary.from_row({})
    assert summary.workers is None and summary.samples_per_s is None and summary.ranks is None
    assert summary.transform is None and summary.syncs_per_step is None and summary.extra == {}
    assert summary.row == {}


def test_a_row_reads_typed_and_keeps_every_cell_in_order():
    row = {"job": "workers=2", "workers": 2, "batch_size": 8, "samples_per_s": 100, "ranks": 1,
           "gpu_notes": "no GPU", "starvation_pct": 12.5, "samples_per_s_ci_low": float("nan"), "batches_per_s": 3.0,
           "pin_memory": False, "alloc_retries": float("nan")}
    summary = Summary.from_row(row)
    assert (summary.job, summary.workers, summary.batch_size, summary.ranks) == ("workers=2", 2, 8, 1)
    assert isinstance(summary.samples_per_s, float) and summary.samples_per_s == 100.0
    assert summary.starvation_pct == 12.5 and summary.samples_per_s_ci_low != summary.samples_per_s_ci_low
    assert summary.gpu_notes == "no GPU" and summary.pin_memory is False and summary.alloc_retries is None
    assert summary.extra == {"batches_per_s": 3.0}
    assert summary.row is row  # every cell kept, in its stored order
    with pytest.raises(AttributeError):
        summary.workers = 4  # frozen


def test_every_column_of_the_table_is_a_typed_field():
    fields = {f.name: f.type for f in dataclasses.fields(Summary)}
    assert [name for name in fields if name != "row"] == SUMMARY_COLUMNS
    assert all(fields[c.name] == Optional[c.kind] for c in SUMMARY_TABLE)
    assert Summary.from_row({"epochs": 2.0, "reserved_oscillating": True}).epochs == 2


def test_an_early_result_folder_loads_typed_and_diagnoses(tmp_path):
    for num, workers in enumerate((0, 2)):
        record = result_record(num, [f"workers={workers}"], summary={"workers": workers})
        for column in EARLY_SUMMARY_LEFT_OUT:
            record["summary"].pop(column, None)
        del record["choices"]
        path = write_record(tmp_path, record)
        assert "schema_version" not in json.loads(path.read_text())
    first, second = load_job_results(tmp_path)
    assert isinstance(first.summary, Summary) and first.summary.workers == 0 and second.key.workers == 2
    assert first.summary.ranks is None and first.summary.samples_per_s_epoch is None
    assert first.summary.samples_per_s == pytest.approx(1000.0) and first.choices == {}
    assert first.to_json()["summary"] is first.summary.row  # the stored mapping, as stored
    diagnosis = diagnose([first, second])
    assert [(row.ranks, row.workers) for row in diagnosis.rows] == [(1, 0), (1, 2)]
    assert chain_costs([first, second]).cpu_ms_per_sample == pytest.approx(1.0)


def test_an_in_memory_result_reads_as_a_record_without_label_number_or_config():
    record = JobResult.read({"summary": {"workers": 1, "batch_size": 4, "transform": "t"}, "passes": [{}]})
    assert (record.job, record.job_num, record.config, record.overrides) == ("default", 0, {}, ())
    assert record.key.transform == "t" and record.passes == ({},) and record.transforms == ()
    assert JobResult.read(record) is record
