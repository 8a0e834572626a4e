"""The meter protocol: every meter of a job has the five methods, owns summary columns that exist,
and survives the job's calling order (start, marks, stop twice) without CUDA."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from pipebench.config.specs import ConsumerSpec
from pipebench.measure.coverage import IndexLog
from pipebench.measure.gpu.alloc_churn import AllocatorTracker
from pipebench.measure.gpu.session import GpuSession
from pipebench.measure.gpu.util import GpuUtilSampler
from pipebench.measure.memory import MemorySampler
from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED, Meter
from pipebench.measure.storage_io import StorageReadMeter
from pipebench.pipeline.consumers import build_consumer
from pipebench.record.results import SUMMARY_COLUMNS


def _cpu_consumer():
    return build_consumer(ConsumerSpec("toy_cnn", 0.0, "fixed", 0.0, 0.01, 0.9, "cpu"), 0)


METERS = {
    "memory": lambda: MemorySampler(interval_s=60),
    "gpu_util": lambda: GpuUtilSampler(enabled=False),
    "allocator": lambda: AllocatorTracker(None),
    "coverage": lambda: IndexLog(length=4),
    "gpu": lambda: GpuSession(_cpu_consumer()),
    "storage_io": StorageReadMeter,
}


@pytest.mark.parametrize("name", METERS)
def test_each_meter_follows_the_protocol(name):
    meter = METERS[name]()
    assert isinstance(meter, Meter) and meter.key == name
    meter.start()
    meter.mark(FIRST_MEASURED)
    meter.mark(LAST_MEASURED)
    meter.stop()
    meter.stop()  # idempotent: the job's finally may follow an earlier stop
    columns = meter.columns()
    assert set(columns) <= set(SUMMARY_COLUMNS), set(columns) - set(SUMMARY_COLUMNS)
    json.dumps(meter.record(), default=str)


def test_the_job_meters_own_disjoint_columns_and_sections():
    meters = [METERS[name]() for name in ("memory", "storage_io", "coverage", "gpu")]
    keys = [meter.key for meter in meters]
    columns = [name for meter in meters for name in meter.columns()]
    assert len(set(keys)) == len(keys)
    assert len(set(columns)) == len(columns)


def test_a_class_without_the_methods_is_not_a_meter():
    assert not isinstance(SimpleNamespace(key="x", start=lambda: None), Meter)


def test_the_index_log_checks_its_own_epochs():
    """Known truth: repeat 0 reads epoch 1 whole (0..3) then part of epoch 2 with index 1 twice."""
    log = IndexLog(length=4)
    log.start()
    for indices, epoch in (([0, 1], 1), ([2, 3], 1), ([1, 1], 2)):
        log(SimpleNamespace(indices=np.array(indices)), epoch)
    log.stop()
    assert log.columns() == {"duplicate_samples": 1, "missed_samples": 0}
    record = log.record()
    assert record["complete_epochs"] == 1 and record["partial_epochs"] == 1


def test_the_index_log_finds_a_miss_in_a_finished_epoch():
    log = IndexLog(length=4)
    for indices, epoch in (([0, 1], 1), ([2, 2], 1), ([0, 1], 2)):
        log(SimpleNamespace(indices=np.array(indices)), epoch)
    log.stop()
    assert log.columns() == {"duplicate_samples": 1, "missed_samples": 1}


def test_a_meter_that_was_never_stopped_leaves_empty_cells():
    assert MemorySampler().columns() == {"rss_mb_peak": None, "worker_pss_growth_mb": None, "shm_mb_peak": None}
    assert IndexLog(length=3).columns() == {"duplicate_samples": None, "missed_samples": None}


def test_storage_reads_are_counted_only_when_they_miss_the_page_cache(tmp_path):
    """Known truth: a file read through the page cache fetches nothing from storage; the same
    file with its pages dropped (posix_fadvise DONTNEED) is fetched again, all of it."""
    import os

    path = tmp_path / "blob"
    size = 8 << 20
    path.write_bytes(os.urandom(size))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.read(fd, size)  # now cached
        meter = StorageReadMeter()
        meter.mark(FIRST_MEASURED)
        os.pread(fd, size, 0)
        meter.mark(LAST_MEASURED)
        assert meter.columns()["storage_read_mb"] < 1
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        cold = StorageReadMeter()
        cold.mark(FIRST_MEASURED)
        os.pread(fd, size, 0)
        cold.mark(LAST_MEASURED)
    finally:
        os.close(fd)
    if cold.columns()["storage_read_mb"] == 0:
        pytest.skip("tmp_path lives in memory (tmpfs): nothing is ever fetched from storage")
    assert cold.columns()["storage_read_mb"] >= 0.9 * size / (1 << 20)
