"""What the report says in a line, from hand-made results: the target line against a set's shards, the
dataset's read named as the storage's cost, and the samples run.on_error=skip dropped."""

from pipebench.record.jobs import JobResult
from pipebench.report.diagnosis import diagnose, render_diagnosis
from pipebench.report.summary import skipped_lines
from pipebench.report.writer import LoadedRun, ReportInputs, skipped_section
from stored_results import transform_row


def _job(workers, rate, steps=(("Decode", 8.0, "per_sample"),), shards=None, **summary):
    """A result.json as the report reads it: batch 8, a 30 ms consumer step, 2 usable cores."""
    dataset = {"name": "webdataset", "shards": shards} if shards else {}
    return {"job": f"job-{workers}", "overrides": ["transform=seed", f"workers={workers}"],
            "summary": {"transform": "seed", "workers": workers, "batch_size": 8, "samples_per_s": rate,
                        "starvation_pct": 50.0, "pipeline_ms_per_sample": 8.0, "cpu_ms_per_sample": 8.0,
                        "transfer_ms_median": 1.0, "ready_next_ms_median": 0.2, **summary},
            "transforms": [transform_row(n, ms, 100 * ms / 8.0, stage) for n, ms, stage in steps],
            "passes": [{"compute_ms": [30.0] * 5, "h2d_ms": [0.0] * 5}],
            "consumer_report": {"kind": "emulated", "device": None},
            "fingerprint": {"usable_cores": 16, "dataset": dataset}}


def test_the_target_line_and_the_idle_readers_line_come_from_one_model():
    """Known truth: 16 ms a sample at batch 8 against a 30 ms step needs ceil(0.9 * 128 / 30) = 4 workers
    for 90% busy; a set of 2 shards feeds 2 of them, which make 2/16 samples a ms, 125 samples/s of the
    consumer's 266.7: 46.875% busy."""
    jobs = [_job(w, 100.0, steps=(("Decode", 16.0, "per_sample"),), shards=2, pipeline_ms_per_sample=16.0,
                 cpu_ms_per_sample=16.0) for w in (0, 4)]
    text = render_diagnosis(diagnose(jobs))
    assert ("transform=seed: 4 reading worker(s) would keep the consumer 90% busy, but its 2 shard(s) give data to 2 "
            "worker(s) at most, which keep it about 46.88% busy (workers=2); write at least 4 shards") in text
    assert "webdataset: 2 shard(s) for 4 readers" in text and "or use workers=2" in text, "item 4 agrees"
    enough = render_diagnosis(diagnose([_job(w, 100.0, steps=(("Decode", 16.0, "per_sample"),), shards=8,
                                             pipeline_ms_per_sample=16.0, cpu_ms_per_sample=16.0) for w in (0, 4)]))
    assert "transform=seed: 4 worker(s) and " in enough and "shard(s) give data" not in enough


def test_a_dominant_read_is_named_as_the_storages_cost_not_the_chains():
    steps = (("ParquetRows", 6.0, "load"), ("Decode", 2.0, "decode"))
    text = render_diagnosis(diagnose([_job(0, 100.0, steps=steps, io_share_of_load_pct=40.0)]))
    assert ("Dominant cost in transform=seed: the dataset's read (ParquetRows: fetching and unpacking each sample "
            "from its storage), 6 ms of each sample (75% of the chain at workers=0); 40% of it in file reads. It is "
            "the storage's cost, not the chain's") in text
    assert "Dominant cost in transform=seed: ParquetRows" not in text


def test_samples_dropped_under_on_error_skip_are_one_line_a_job():
    failure = {"index": 17, "where": "/data/x.jpg", "step": "RandomCrop", "message": "image too small"}
    results = [JobResult.from_stored(job) for job in (_job(0, 100.0, skipped_samples=3) | {"skipped": [failure]},
                                                      _job(2, 100.0, skipped_samples=0))]
    assert skipped_lines(results) == ["job-0: run.on_error=skip dropped 3 sample(s) that raised: sample 17 "
                                      "(/data/x.jpg) failed in RandomCrop: image too small; and 2 more; the rates "
                                      "count only the samples that made it"]
    inputs = ReportInputs((LoadedRun(None, tuple(results)),), None, (), None)
    assert skipped_section(inputs).startswith("## skipped samples\n\n- job-0: run.on_error=skip dropped 3")
    assert skipped_lines(results[1:]) == [] and skipped_section(ReportInputs((), None, (), None)) is None
