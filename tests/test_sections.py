"""result.json's typed sections: built by their own field names, strict where a field is required."""

import pytest

from pipebench.record.jobs import JobResult
from pipebench.base.typed_json import parse
from pipebench.record.sections import PassRecord, TransformRow, measured_row

ROW = {"stage": "per_sample", "transform": "Resize", "calls": 8, "ms_per_call_mean": 1.5,
       "ms_per_call_median": 1.25, "ms_per_sample": 1.5, "share_pct": 60.0}


def test_a_row_reads_its_fields_and_writes_back_only_what_was_measured():
    row = parse(TransformRow, {**ROW, "thread_verdict": "scales"})
    assert (row.transform, row.ms_per_call_median, row.thread_verdict) == ("Resize", 1.25, "scales")
    assert measured_row(row) == ROW


def test_a_row_without_a_required_field_is_refused_by_name():
    with pytest.raises(ValueError, match="TransformRow lacks ms_per_sample"):
        parse(TransformRow, {k: v for k, v in ROW.items() if k != "ms_per_sample"})


def test_a_pass_keeps_undeclared_keys_apart_and_counts_every_step_steady_by_default():
    one = parse(PassRecord, {"samples": [4, 4], "step_ms": [2.0, 3.0], "future_key": 1})
    assert one.samples == (4, 4) and one.steady_mask == (True, True) and one.extra == {"future_key": 1}


def test_a_stored_result_offers_its_sections_typed():
    result = JobResult.from_stored({"summary": {"workers": 0, "batch_size": 4}, "transforms": [ROW],
                                    "fingerprint": {"usable_cores": 3, "dataset": {"name": "tars", "shards": 2}},
                                    "consumer_report": {"kind": "emulated", "step_ms": 5}})
    assert result.transform_rows[0].share_pct == 60.0
    assert (result.host.usable_cores, result.host.dataset_facts.shards) == (3, 2)
    assert (result.consumer_report.kind, result.consumer_report.extra) == ("emulated", {"step_ms": 5})
