"""The exactly-once check, and the catalogue's sharded IterableDataset measured against it."""

from dataclasses import replace

import pytest
import torch
from conftest import compose_spec
from stored_results import transform_row
from torch.utils.data import DistributedSampler, IterableDataset

from pipebench.base.errors import ConfigError
from pipebench.datasets.random_tensors import RandomTensorDataset
from pipebench.datasets.sharded_stream import ShardedStream, shard_of
from pipebench.measure.coverage import check_coverage, droppable_per_epoch, merge_logs
from pipebench.measure.job import measure_job
from pipebench.measure.runner import BatchStream
from pipebench.pipeline.build import build_dataset, build_pipeline
from pipebench.pipeline.loader_backends import build_loader


def test_exactly_once_over_pooled_ranks():
    logs = [{(0, 1): [0, 2, 4, 6], (0, 2): [4]}, {(0, 1): [1, 3, 5, 7], (0, 2): [5, 1]}]
    report = check_coverage(merge_logs(logs), length=8, complete={(0, 1)})
    assert report.exactly_once
    assert (report.complete_epochs, report.partial_epochs, report.samples_seen) == (1, 1, 11)


def test_duplicates_and_misses_are_counted_and_named():
    # Both ranks read the first half: 4 duplicate reads, and the second half is never read.
    logs = [{1: [0, 1, 2, 3]}, {1: [0, 1, 2, 3]}]
    report = check_coverage(merge_logs(logs), length=8, complete={1})
    assert (report.duplicates, report.missing) == (4, 4)
    assert report.duplicate_examples == (0, 1, 2, 3) and report.missing_examples == (4, 5, 6, 7)
    assert not report.exactly_once
    assert "4 duplicate reads" in report.describe() and "4 missed" in report.describe()


def test_partial_epoch_is_checked_for_duplicates_only():
    report = check_coverage({1: [0, 1, 2, 3], 2: [3, 3]}, length=4, complete={1})
    assert (report.duplicates, report.missing) == (1, 0)
    assert report.duplicate_examples == (3,)


def test_out_of_range_index_counts_as_a_duplicate_read():
    report = check_coverage({1: [0, 1, 9]}, length=2, complete={1})
    assert report.duplicates == 1 and report.missing == 0


def test_shards_cover_ranks_and_workers_disjointly():
    seen = []
    for rank in range(2):
        for worker in range(3):
            start, step = shard_of(rank, 2, worker, 3)
            seen.extend(range(start, 50, step))
    assert sorted(seen) == list(range(50))


def _epoch_indices(overrides, monkeypatch, rank, world, steps):
    """Indices of `steps` batches from the real pipeline of one rank (RANK/WORLD_SIZE as torchrun sets them)."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    spec = compose_spec(overrides)
    _, instrumented, collate = build_pipeline(spec)
    loader = build_loader(spec, instrumented, collate)
    stream = BatchStream(loader, spec.run.on_error)
    try:
        return [int(i) for _ in range(steps) for i in stream.next().indices]
    finally:
        stream.close()


STREAM = ["dataset=sharded_stream", "dataset.source.shape=[3,8,8]", "dataset.source.length=48",
          "transform.per_sample=[]", "loader.batch_size=4"]


@pytest.mark.parametrize("workers", [0, 2])
def test_sharded_stream_reads_each_index_once_across_ranks_and_workers(monkeypatch, workers):
    # 48 samples / 2 ranks / 4 per batch = 6 batches a rank per epoch.
    logs = [{1: _epoch_indices([*STREAM, f"workers={workers}"], monkeypatch, rank, 2, steps=6)} for rank in range(2)]
    report = check_coverage(merge_logs(logs), length=48, complete={1})
    assert report.exactly_once, report.describe()


def test_unsharded_stream_is_caught(monkeypatch):
    logs = [{1: _epoch_indices([*STREAM, "dataset.shard=false", "workers=2"], monkeypatch, rank, 2, steps=6)}
            for rank in range(2)]
    report = check_coverage(merge_logs(logs), length=48, complete={1})
    # Every copy (2 ranks x 2 workers) starts at index 0: the first 6 batches repeat a few indices
    # four times and never reach the rest.
    assert report.duplicates > 0 and report.missing > 0


def test_map_style_rank_gets_a_distributed_sampler(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    spec = compose_spec(["dataset=random_tensors", "dataset.length=64", "transform.per_sample=[]"])
    _, instrumented, collate = build_pipeline(spec)
    loader = build_loader(spec, instrumented, collate)
    assert isinstance(loader.sampler, DistributedSampler)
    assert (loader.sampler.rank, loader.sampler.num_replicas, loader.sampler.drop_last) == (1, 2, True)


def test_stream_identity_names_its_source():
    stream = ShardedStream(RandomTensorDataset(shape=[3, 4, 4], length=8), shard=False)
    identity = stream.identity()
    assert identity["name"] == "sharded_stream" and identity["shard"] is False
    assert identity["source"]["name"] == "random_tensors"


@pytest.mark.parametrize("shard", [True, False])
def test_single_process_job_checks_its_workers_too(tmp_path, shard):
    spec = compose_spec([*STREAM, f"dataset.shard={shard}", "workers=2", "consumer=none", "run=quick",
                         "run.progress=false", "trace=none"])
    record = measure_job(spec, tmp_path)
    coverage = record.sections["coverage"]
    assert coverage["complete_epochs"] >= 1
    if shard:
        assert coverage["exactly_once"], coverage
    else:  # each of the 2 workers reads the whole stream: every index twice an epoch
        assert record.summary.duplicate_samples >= coverage["length"] * coverage["complete_epochs"]


class NoLenStream(IterableDataset):
    def __iter__(self):
        yield 0, torch.zeros(3), 0


def test_stream_without_len_is_a_config_error():
    spec = replace(compose_spec([]), dataset={"_target_": f"{__name__}.NoLenStream"})
    with pytest.raises(ConfigError, match="must define __len__"):
        build_dataset(spec)


def test_misses_drop_last_explains_are_a_known_loss_and_only_the_rest_fail():
    """Known truth: 300 samples at batch 32 leave 12 unread an epoch under drop_last; a miss of 40
    is more than one reader's last batch can hold."""
    read = list(range(288))
    report = check_coverage({1: read, 2: read}, length=300, complete={1, 2}, droppable=32)
    assert (report.missing, report.dropped_last, report.exactly_once) == (0, 24, True)
    assert "24 in last batches loader.drop_last=true drops" in report.describe()
    assert report.columns() == {"duplicate_samples": 0, "missed_samples": 0, "dropped_last_samples": 24}
    lost = check_coverage({1: read, 2: list(range(260))}, length=300, complete={1, 2}, droppable=32)
    assert (lost.missing, lost.dropped_last, lost.exactly_once) == (40, 12, False)
    assert lost.missing_examples[0] == 260
    assert check_coverage({1: read}, length=300, complete={1}).missing == 12, "drop_last=false explains none"
    raised = check_coverage({1: [i for i in read if i != 7]}, length=300, complete={1}, droppable=32, failed={1: [7]})
    assert (raised.missing, raised.dropped_last, raised.skipped) == (0, 12, 1), "on_error=skip's sample was read"


def test_drop_last_may_drop_a_batch_per_ranks_sampler_and_per_workers_copy_of_a_stream():
    spec = compose_spec(["workers=3", "loader.batch_size=8", "loader.drop_last=true", "distributed.nproc=2"])
    assert (droppable_per_epoch(spec, iterable=False), droppable_per_epoch(spec, iterable=True)) == (16, 48)
    assert droppable_per_epoch(replace(spec, loader=replace(spec.loader, drop_last=False)), iterable=True) == 0


def _job(workers, coverage):
    """A result.json as the diagnosis reads it, with only what it needs and its coverage record."""
    return {"overrides": ["transform=seed", f"workers={workers}"],
            "summary": {"transform": "seed", "workers": workers, "batch_size": 32, "samples_per_s": 100.0,
                        "starvation_pct": 50.0, "pipeline_ms_per_sample": 8.0, "cpu_ms_per_sample": 8.0,
                        "transfer_ms_median": 1.0, "ready_next_ms_median": 0.2},
            "transforms": [transform_row("Decode", 8.0)],
            "passes": [{"compute_ms": [30.0] * 5, "h2d_ms": [0.0] * 5}],
            "consumer_report": {"kind": "emulated", "device": None}, "fingerprint": {"usable_cores": 2},
            "coverage": coverage}


def test_the_diagnosis_names_the_drop_last_loss_and_the_jobs_that_fail_the_check():
    from pipebench.report.diagnosis import diagnose, render_diagnosis

    read = list(range(288))
    dropped = check_coverage({1: read, 2: read}, length=300, complete={1, 2}, droppable=32).as_dict()
    text = render_diagnosis(diagnose([_job(0, dropped), _job(2, dropped)]))
    assert ("Exactly once but for the last batch: transform=seed at workers=0 (12 samples an epoch), transform=seed "
            "at workers=2 (12 samples an epoch) read every sample index once an epoch except the last partial batch "
            "each reader drops under loader.drop_last=true, a known loss and no failure of the check; "
            "loader.drop_last=false reads them.") in text
    assert "check failed" not in text
    twice = check_coverage({1: [*read, 0]}, length=300, complete={1}, droppable=32).as_dict()
    text = render_diagnosis(diagnose([_job(0, dropped), _job(2, twice)]))
    assert ("Exactly-once check failed, transform=seed at workers=2: 1 duplicate reads (e.g. [0]) in 1 finished "
            "epoch(s)") in text
    assert "transform=seed at workers=0 (12 samples an epoch) read" in text, "the other job's known loss"


def test_the_index_log_counts_a_sample_on_error_skip_dropped_as_read():
    from types import SimpleNamespace

    from pipebench.measure.coverage import IndexLog

    log = IndexLog(length=4)
    for indices, failed, epoch in (([0, 1], (), 1), ([2], (3,), 1), ([0, 1], (), 2)):
        log(SimpleNamespace(indices=indices, failures=tuple(SimpleNamespace(index=i) for i in failed)), epoch)
    log.stop()
    assert log.columns()["missed_samples"] == 0 and log.record()["skipped"] == 1
