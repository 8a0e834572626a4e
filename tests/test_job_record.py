"""The typed job record the results loader returns, and one naming of jobs across every reader."""

import json
from pathlib import Path

import pytest
from stored_results import result_record, write_record

from pipebench.explore.plan import _settings
from pipebench.record.jobs import JobKey, JobResult, job_key, varying_keys
from pipebench.record.results import RESULT_FILE, load_job_results, read_result, write_result
from pipebench.regress.compare import load_run, short_labels
from pipebench.report.comparison import group_rows, swept_axes
from pipebench.report.diagnosis import chain_labels

TRANSFORMS, WORKERS, ROUNDS = ("a", "b"), (0, 2), 2


def _sweep(folder: Path) -> None:
    """transform=a,b x workers=0,2 x 2 rounds, labelled as Hydra labels jobs (sorted overrides)."""
    num = 0
    for rnd in range(ROUNDS):
        for transform in TRANSFORMS:
            for workers in WORKERS:
                overrides = [f"run.round={rnd}", "rounds=2", f"transform={transform}", f"workers={workers}"]
                write_record(folder, result_record(num, overrides, rates=[100.0 + num],
                                                   summary={"transform": transform, "workers": workers},
                                                   config={"run": {"round": rnd}, "workers": workers}))
                num += 1


def test_the_record_is_typed_frozen_and_round_trips(tmp_path):
    _sweep(tmp_path)
    records = load_job_results(tmp_path)
    first = records[0]
    assert isinstance(first, JobResult) and first.job_num == 0 and first.round == 0
    assert first.key == JobKey("rounds=2,transform=a,workers=0", "random_tensors", "a", 0, 32, "none")
    assert records[4].round == 1 and records[4].key == first.key  # rounds share a key
    assert len({r.key for r in records}) == len(TRANSFORMS) * len(WORKERS)  # hashable
    with pytest.raises(AttributeError):
        first.job = "other"  # frozen
    # Written back, the record's stored mapping is the same file (the on-disk format is unchanged);
    # written by an older pipebench (no schema_version, as here, and no choices), it loads alike.
    stored = json.loads((tmp_path / "job-0" / RESULT_FILE).read_text())
    assert "schema_version" not in stored and first.to_json() == stored and first.choices == {}
    again = tmp_path / "again"
    again.mkdir()
    write_result(again, first.to_json())
    reloaded = JobResult.from_stored(read_result(again / RESULT_FILE))
    assert reloaded.key == first.key and reloaded.summary.row == first.summary.row and reloaded.passes == first.passes


def test_labels_and_varying_keys_agree_across_report_compare_explore_and_diagnosis(tmp_path):
    _sweep(tmp_path)
    records = load_job_results(tmp_path)
    swept = {"transform", "workers"}
    # Report: one row per job, rounds together; its axes are the keys that vary.
    rows = group_rows([(tmp_path, records)])
    assert len(rows) == 4 and all(row.rounds == ROUNDS for row in rows)
    assert set(swept_axes(rows)) == swept
    # Compare: one job per key, labelled by the same varying keys.
    run = load_run(str(tmp_path))
    assert sorted(run.jobs) == sorted({job_key(r.job) for r in records}) == sorted(row.label for row in rows)
    labels = short_labels(list(run.jobs.values()))
    assert {k.split("=")[0] for label in labels.values() for k in label.split(",")} == swept
    # Explore: the setting is what varies besides the chain; diagnosis: the chain, besides workers.
    assert set(_settings(records)) == {f"workers={w}" for w in WORKERS}
    assert set(chain_labels(records)) == {f"transform={t}" for t in TRANSFORMS}
    assert set(varying_keys([r.pairs for r in records])) == swept


def test_varying_keys_count_a_missing_key_as_a_value():
    assert varying_keys([{"a": "1", "b": "x"}, {"a": "2", "b": "x"}, {"b": "x", "c": "3"}]) == ["a", "c"]
    assert varying_keys([{"a": "1"}, {"a": "1"}]) == []
