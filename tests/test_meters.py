"""The meter protocol: every meter of a job subclasses Meter (so has the six methods, its own or the
protocol's no-op defaults), owns summary columns that exist, notes into note columns that exist, and
survives the job's calling order (start, marks, stop twice) without CUDA."""

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import psutil
import pytest

from pipebench.config.specs import ConsumerSpec
from pipebench.measure.coverage import IndexLog
from pipebench.measure.gpu.alloc_churn import AllocatorTracker
from pipebench.measure.gpu.session import GpuSession
from pipebench.measure.gpu.util import GpuUtilSampler
from pipebench.measure.host_load import HostLoadMeter, HostReading, host_load_note, other_load
from pipebench.measure.memory import MemorySampler
from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED, Meter, add_notes
from pipebench.measure.job_run import METER_KINDS, job_meters
from pipebench.measure.storage_io import StorageReadMeter
from pipebench.pipeline.consumers import build_consumer
from pipebench.record.figures import Summary
from pipebench.record.results import SUMMARY_COLUMNS

# The stranger process spins past the meter's one-second window.
SPIN_S = 2.0
# The summary's note columns, which meters' notes go to.
NOTE_COLUMNS = {"window_note", "gpu_notes"}
# A row every noting meter has a line for (other processes kept every CPU busy; the GPU trace's
# steps were far busier than the window's), its note columns already holding one each.
BUSY_ROW = {"window_note": "an epoch ended", "gpu_notes": "not measured: no CUDA",
            "host_other_cpu_cores": float(psutil.cpu_count()), "host_steal_pct": 0.0, "accel_util_pct": 24.0,
            "trace_accel_util_pct": 90.0}


def _cpu_consumer():
    return build_consumer(ConsumerSpec("toy_cnn", 0.0, "fixed", 0.0, 0.01, 0.9, "cpu"), 0)


METERS = {
    "memory": lambda: MemorySampler(interval_s=60),
    "gpu_util": lambda: GpuUtilSampler(enabled=False),
    "allocator": lambda: AllocatorTracker(None),
    "coverage": lambda: IndexLog(length=4),
    "gpu": lambda: GpuSession(_cpu_consumer()),
    "storage_io": StorageReadMeter,
    "host_load": HostLoadMeter,
}


@pytest.mark.parametrize("name", METERS)
def test_each_meter_follows_the_protocol(name):
    meter = METERS[name]()
    assert Meter in type(meter).__mro__ and isinstance(meter, Meter) and meter.key == name
    meter.start()
    meter.mark(FIRST_MEASURED)
    meter.mark(LAST_MEASURED)
    meter.stop()
    meter.stop()  # idempotent: the job's finally may follow an earlier stop
    columns = meter.columns()
    assert set(columns) <= set(SUMMARY_COLUMNS), set(columns) - set(SUMMARY_COLUMNS)
    json.dumps(meter.record(), default=str)
    notes = meter.notes(Summary.from_row(BUSY_ROW))
    assert set(notes) <= NOTE_COLUMNS and all(isinstance(line, str) for line in notes.values())
    assert type(meter).notes(Summary.from_row(BUSY_ROW)) == notes  # from the row alone: a rank merge has no meter


def _job_meters():
    """The meters a job and a rank run, as they build them (pipebench.measure.job_run)."""
    return job_meters(IndexLog(length=4), GpuSession(_cpu_consumer()))


def test_the_job_meters_own_disjoint_columns_and_sections():
    meters = _job_meters()
    keys = [meter.key for meter in meters]
    columns = [name for meter in meters for name in meter.columns()]
    assert len(set(keys)) == len(keys)
    assert len(set(columns)) == len(columns)


def test_a_class_without_the_methods_is_not_a_meter():
    assert not isinstance(SimpleNamespace(key="x", start=lambda: None), Meter)
    five = {name: lambda *_: None for name in ("start", "mark", "stop", "columns", "record")}
    assert not isinstance(SimpleNamespace(key="x", holds_loop=False, **five), Meter)  # no notes


def test_each_meter_notes_a_row_once_in_its_own_column_after_what_the_row_says():
    """Known truth: a host kept busy by others and a GPU trace far busier than the window each add
    their line to their column, after the line already there; the job's meters and
    their classes (what a rank merge holds) note alike, and a quiet row gets no line."""
    meters = _job_meters()
    noted = dict(BUSY_ROW)
    add_notes(noted, meters)
    assert noted["window_note"].startswith("an epoch ended; other processes used ")
    assert noted["gpu_notes"].startswith("not measured: no CUDA; the GPU trace's steps had accel_util_pct 90%")
    merged = dict(BUSY_ROW)
    add_notes(merged, METER_KINDS)
    assert merged == noted and [type(m) for m in meters] == list(METER_KINDS)
    quiet = {**BUSY_ROW, "host_other_cpu_cores": 0.0, "trace_accel_util_pct": 24.0}
    add_notes(quiet, METER_KINDS)
    assert quiet == {**BUSY_ROW, "host_other_cpu_cores": 0.0, "trace_accel_util_pct": 24.0}


def test_the_index_log_checks_its_own_epochs():
    """Known truth: repeat 0 reads epoch 1 whole (0..3) then part of epoch 2 with index 1 twice."""
    log = IndexLog(length=4)
    log.start()
    for indices, epoch in (([0, 1], 1), ([2, 3], 1), ([1, 1], 2)):
        log(SimpleNamespace(indices=np.array(indices)), epoch)
    log.stop()
    assert log.columns() == {"duplicate_samples": 1, "missed_samples": 0, "dropped_last_samples": 0}
    record = log.record()
    assert record["complete_epochs"] == 1 and record["partial_epochs"] == 1


def test_the_index_log_finds_a_miss_in_a_finished_epoch():
    log = IndexLog(length=4)
    for indices, epoch in (([0, 1], 1), ([2, 2], 1), ([0, 1], 2)):
        log(SimpleNamespace(indices=np.array(indices)), epoch)
    log.stop()
    assert log.columns() == {"duplicate_samples": 1, "missed_samples": 1, "dropped_last_samples": 0}


def test_a_meter_that_was_never_stopped_leaves_empty_cells():
    assert MemorySampler().columns() == {"rss_mb_peak": None, "pss_mb_peak": None,
                                         "worker_pss_growth_mb": None, "shm_mb_peak": None}
    assert IndexLog(length=3).columns() == {"duplicate_samples": None, "missed_samples": None,
                                            "dropped_last_samples": None}


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


def test_other_load_is_the_hosts_busy_cpu_less_the_jobs_own():
    first = HostReading(host_busy_s=100.0, host_steal_s=10.0, own_cpu_s=5.0, wall_s=0.0)
    last = HostReading(host_busy_s=104.0, host_steal_s=10.4, own_cpu_s=7.0, wall_s=2.0)
    figures = other_load(first, last)
    assert figures["host_other_cpu_cores"] == pytest.approx(1.0)  # (4 - 2) CPU s over 2 s
    cpus = psutil.cpu_count()
    assert figures["host_steal_pct"] == pytest.approx(100 * 0.4 / (2.0 * cpus))


def test_the_note_names_heavy_other_load_and_steal_and_stays_quiet_otherwise():
    assert host_load_note(0.05, 0.0, cpus=2) is None
    busy = host_load_note(1.3, 0.0, cpus=2)
    assert "1.3 of the host's 2 CPUs" in busy and "rounds=N" in busy
    assert "stole 5%" in host_load_note(0.0, 5.0, cpus=96)
    assert host_load_note(4.0, 0.0, cpus=96) is None  # 4 of 96 CPUs is below a tenth


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.slow
@pytest.mark.alone  # it reads the host's load: another test beside it is load
def test_a_process_outside_the_job_counts_and_the_jobs_own_work_does_not():
    """A busy process the job did not start (reparented to init) shows as other load; the job's own
    spinning does not. Side by side in one test, so the machine's other load cancels out."""
    own = HostLoadMeter()
    own.mark(FIRST_MEASURED)
    _spin(1.0)
    own.mark(LAST_MEASURED)
    spin = f"import time; e = time.perf_counter() + {SPIN_S}\nwhile time.perf_counter() < e: pass"
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{spin}" &'], check=True)  # sh exits: not our child
    time.sleep(0.3)  # the stranger is running
    stranger = HostLoadMeter()
    stranger.mark(FIRST_MEASURED)
    time.sleep(1.0)
    stranger.mark(LAST_MEASURED)
    assert stranger.columns()["host_other_cpu_cores"] - own.columns()["host_other_cpu_cores"] > 0.4


def test_a_following_storage_meter_starts_from_the_last_reading_without_reading_again(monkeypatch):
    """Windows end to end: the next meter's first reading is the last one's, so a boundary reads the
    process tree once, and the bytes between two windows land in exactly one of them."""
    readings = iter([{1: 0}, {1: 3 << 20}, {1: 5 << 20}])
    calls = []

    def read():
        calls.append(1)
        return next(readings)

    monkeypatch.setattr("pipebench.measure.storage_io._read_bytes", read)
    first = StorageReadMeter()
    first.mark(FIRST_MEASURED)
    first.mark(LAST_MEASURED)
    second = first.following()
    second.mark(LAST_MEASURED)
    assert len(calls) == 3
    assert first.columns()["storage_read_mb"] == 3.0
    assert second.columns()["storage_read_mb"] == 2.0
