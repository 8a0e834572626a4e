"""The writer's typed result: a job's result.json is today's file, key for key and byte for byte."""

import json

import pytest
from conftest import FAST_JOB, NO_CHAIN, compose_spec

from pipebench.measure.job import measure_job
from pipebench.record.jobs import SINGLE_PROCESS_FIELDS, JobIdentity, JobResult, identity_columns

# result.json's sections as a single-process job wrote them before the typed result, in order.
JOB_SECTIONS = ["summary", "memory", "storage_io", "host_load", "coverage", "gpu", "transforms", "thread_profile",
                "workers_breakdown", "consumer_report", "passes", "window", "skipped", "artifacts", "viztrace",
                "pin_memory_effective", "fingerprint"]
# ... and as the rank merge wrote them.
RANK_SECTIONS = ["summary", "transforms", "ranks", "rank_transforms", "passes", "window", "rank_passes",
                 "distributed", "coverage", "rank_meters", "fingerprint"]
IDENTITY = ["job", "job_num", "overrides", "config", "choices"]


def _legacy(record, identity):
    """result.json as pipebench.sweep.one_job composed it by hand before JobResult (the reference)."""
    summary = {"job": identity.job, **identity.columns, **SINGLE_PROCESS_FIELDS, **record["summary"]}
    return {"job": identity.job, "job_num": identity.job_num, "overrides": list(identity.overrides),
            "config": identity.config, "choices": identity.choices, **record, "summary": summary}


def _identity(spec, overrides):
    return JobIdentity(job=",".join(overrides), job_num=3, overrides=tuple(overrides),
                       config={"workers": spec.workers, "run": {"seed": 0}}, choices={"dataset": "random_tensors"},
                       columns=identity_columns(spec))


def test_a_jobs_result_json_is_the_file_it_wrote_before(tmp_path):
    overrides = [*FAST_JOB, *NO_CHAIN, "workers=0", "run.steps=8"]
    spec = compose_spec(overrides)
    measured = measure_job(spec, tmp_path)
    assert isinstance(measured, JobResult) and list(measured.to_json()) == JOB_SECTIONS
    identity = _identity(spec, overrides)
    written = measured.identified(identity).to_json()
    assert json.dumps(written) == json.dumps(_legacy(measured.to_json(), identity))
    assert list(written) == [*IDENTITY, *JOB_SECTIONS]
    assert list(written["summary"])[:9] == ["job", "dataset", "transform", "workers", "batch_size", "consumer",
                                            *SINGLE_PROCESS_FIELDS]
    assert written["transforms"] is measured.sections["transforms"] and written["passes"] is measured.sections["passes"]
    with pytest.raises(AttributeError):
        measured.summary = {}  # frozen


def test_a_rank_merges_sections_keep_their_order_and_its_rank_columns_their_values():
    sections = {name: [name] for name in RANK_SECTIONS[1:]}
    merged = JobResult({"samples_per_s": 10.0, "ranks": 2, "straggler_ratio": 1.3}, sections)
    spec = compose_spec([*FAST_JOB, "workers=2"])
    written = merged.identified(_identity(spec, ["workers=2"])).to_json()
    assert json.dumps(written) == json.dumps(_legacy(merged.to_json(), _identity(spec, ["workers=2"])))
    assert list(written) == [*IDENTITY, *RANK_SECTIONS]
    assert (written["summary"]["ranks"], written["summary"]["straggler_ratio"]) == (2, 1.3)
    assert written["summary"]["collective_wait_ms_mean"] == 0.0 and written["summary"]["workers"] == 2
    # Without an identity, the measured sections alone, as measure returned them before.
    assert merged.to_json() == {"summary": merged.summary.row, **sections}


def test_identity_columns_are_the_specs():
    spec = compose_spec([*FAST_JOB, "workers=2", "loader.batch_size=4"])
    assert identity_columns(spec) == {"dataset": spec.dataset_name, "transform": spec.transform_name, "workers": 2,
                                      "batch_size": 4, "consumer": "none"}
