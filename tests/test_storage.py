"""Cold and warm file reads, the emulated storage, the I/O figures and the storage settings' checks."""

import os
import time

import numpy as np
import psutil
import pytest
from conftest import assert_config_error_is_one_line, compose_spec
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import PILToTensor

from pipebench.base.errors import StepTimeoutError
from pipebench.base.watchdog import Watchdog
from pipebench.config.specs import StorageSpec
from pipebench.datasets.image_folder import ImageFolderDataset
from pipebench.storage import page_cache
from pipebench.measure.guard import STEP_TIMEOUT_KEY
from pipebench.measure.steps import TimingSink
from pipebench.storage.page_cache import prepare_cache
from pipebench.measure.storage_io import file_read_columns, file_read_figures
from pipebench.storage.file_reads import BYTES_PER_MB, IO_FIELDS, FileReads
from pipebench.pipeline.timed_chain import InstrumentedDataset, SampleFailure, TimedCollate, TimedItem

MIB = 1 << 20


def _storage_bytes() -> int:
    """Bytes this process made the kernel fetch from a block device (/proc/self/io read_bytes)."""
    return psutil.Process().io_counters().read_bytes


def _blobs(folder, count: int, size: int):
    paths = []
    for k in range(count):
        path = folder / f"blob{k}"
        path.write_bytes(os.urandom(size))
        paths.append(str(path))
    os.sync()  # a dirty page is never dropped: write them back first, as prepare_cache does
    return paths


def _jpegs(folder, count: int):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for k in range(count):
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / f"{k}.jpg", quality=90)
    return folder


def test_cold_reads_go_to_storage_every_time_and_warm_reads_do_not(tmp_path):
    """Known truth from the kernel's own counter: each cold read of a file fetches all of it from
    storage again, even right after a read; a warm read of a cached file fetches nothing."""
    paths = _blobs(tmp_path, 4, 2 * MIB)
    warm, cold = FileReads(StorageSpec(cache="warm")), FileReads(StorageSpec(cache="cold"))
    for path in paths:
        warm.read(path)  # cached now
    before = _storage_bytes()
    for path in paths:
        warm.read(path)
    warm_fetched = _storage_bytes() - before
    before = _storage_bytes()
    for _ in range(2):
        for path in paths:
            cold.read(path)
    cold_fetched = _storage_bytes() - before
    if cold_fetched == 0:
        pytest.skip("tmp_path lives in memory (tmpfs): nothing is ever fetched from storage")
    assert warm_fetched < MIB
    assert cold_fetched >= 0.9 * 2 * 4 * 2 * MIB, "each of the two cold passes reads every byte from storage"
    assert cold.counts()[1:4] == (2 * 4 * 2 * MIB, 8, 8), "bytes, files, requests: one whole-file read each"


def test_emulated_storage_sleeps_latency_plus_bytes_over_bandwidth(tmp_path):
    (path,) = _blobs(tmp_path, 1, 3 * MIB)
    slept = []
    reads = FileReads(StorageSpec(latency_ms=5.0, mb_per_s=100.0), sleep=slept.append)
    assert reads.read(path) == open(path, "rb").read()
    assert slept == [pytest.approx(0.005 + 3 / 100)]
    latency_only = FileReads(StorageSpec(latency_ms=5.0), sleep=slept.append)
    latency_only.read(path)
    assert slept[-1] == pytest.approx(0.005)
    slept.clear()
    FileReads(StorageSpec(), sleep=slept.append).read(path)
    assert slept == [], "no emulation, no sleep"


# The one test here that reads a clock against a truth: under xdist it runs with no other test beside
# it. The rest assert on the kernel's byte counters, notices, lines and exit statuses, and share the cores.
@pytest.mark.alone
def test_the_emulated_wait_is_counted_as_read_time(tmp_path):
    """With the real sleep: a small cached file read through 40 ms of emulated latency takes
    40 ms of read time, as a ratio (a loaded machine only oversleeps)."""
    (path,) = _blobs(tmp_path, 1, 4096)
    reads = FileReads(StorageSpec(latency_ms=40.0))
    for _ in range(5):
        reads.read(path)
    per_read_ms = reads.counts()[0] / 5 / 1e6
    assert 1.0 <= per_read_ms / 40.0 < 1.5


def test_workers_send_back_the_bytes_each_sample_read(tmp_path):
    """Known truth: every sample's load step reports exactly its file's size and one file, from
    whichever worker read it; the figures are these sums."""
    dataset = ImageFolderDataset(_jpegs(tmp_path / "imgs", 8))
    sizes = {k: os.path.getsize(path) for k, path in enumerate(dataset.files())}
    instrumented = InstrumentedDataset(dataset, [PILToTensor()])
    loader = DataLoader(instrumented, batch_size=2, num_workers=2, collate_fn=TimedCollate([]))
    sink = TimingSink()
    for batch in loader:
        sink.add(batch)
        assert len(batch.indices) == 2 and not batch.failures
        assert batch.sample_io[:, 1].tolist() == [sizes[int(i)] for i in batch.indices]
        assert batch.sample_io[:, 2].tolist() == [1] * len(batch.indices)
    assert set(sink.worker_ids) == {0, 1}
    columns = file_read_columns(sink, samples_per_s=100.0)
    mean_size = sum(sizes.values()) / len(sizes)
    assert columns["read_bytes_per_sample"] == pytest.approx(mean_size)
    assert columns["read_files_per_sample"] == 1.0
    assert columns["read_mb_per_s"] == pytest.approx(mean_size * 100.0 / BYTES_PER_MB)
    assert 0 < columns["io_share_of_load_pct"] <= 100


class _FailingBatchStep:
    def __call__(self, data):
        raise ValueError("no batch")


def test_a_batch_with_no_sample_left_keeps_the_per_sample_widths():
    """A batch whose samples all failed, or whose per-batch step failed, carries empty per-sample
    arrays as wide as the per-sample chain and IO_FIELDS, so they stack with the batches beside it."""
    failed = SampleFailure(0, "sample 0", "ImageFolderDataset", "OSError: gone")
    good = TimedItem(np.zeros(3), 0, np.zeros(4, np.int64), 0, 1, np.zeros(len(IO_FIELDS), np.int64))
    collate = TimedCollate([_FailingBatchStep()], sample_steps=4)
    for batch in (collate([failed]), collate([failed, good])):
        assert batch.data is None and batch.failures[0] == failed
        assert batch.sample_ns.shape == (0, 4) and batch.sample_io.shape == (0, len(IO_FIELDS))


def test_read_figures_are_the_sums_they_say():
    io = np.array([[2_000_000, 1000, 1, 1, 500_000], [6_000_000, 3000, 1, 3, 500_000]], dtype=np.int64)  # IO_FIELDS
    figures = file_read_figures(io, load_ns=np.array([4_000_000, 12_000_000]))
    assert figures == {
        "read_bytes_per_sample": 2000.0,
        "read_files_per_sample": 1.0,
        "read_requests_per_sample": 2.0,
        "read_ms_per_sample": 4.0,
        "read_speed_mb_per_s": pytest.approx(4000 / BYTES_PER_MB / 0.008),
        "io_share_of_load_pct": 50.0,
    }
    assert set(file_read_figures(np.zeros((3, len(IO_FIELDS)), np.int64), np.ones(3)).values()) == {None}


def test_warm_says_the_page_cache_serves_the_run_when_the_files_fit(tmp_path):
    dataset = ImageFolderDataset(_jpegs(tmp_path / "imgs", 3))
    size = sum(os.path.getsize(p) for p in dataset.files())
    fits = prepare_cache(dataset, StorageSpec(), available_bytes=size * 10)
    assert fits.cache_mode == "warm" and len(fits.notices) == 1
    assert "page cache serves this run" in fits.notices[0] and "page cache serves" in fits.columns()["storage_note"]
    too_big = prepare_cache(dataset, StorageSpec(), available_bytes=size // 2)
    assert "exceed" in too_big.columns()["storage_note"]
    cold = prepare_cache(dataset, StorageSpec(cache="cold"), available_bytes=size * 10)
    assert cold.cache_mode == "cold" and cold.notices == () and cold.note is None


def test_without_posix_fadvise_cold_runs_warm_with_one_notice_and_the_row_says_so(tmp_path, monkeypatch, capsys):
    """The whole job, in this process, on a platform without posix_fadvise."""
    from pipebench.measure.job import measure_job

    monkeypatch.delattr(os, "posix_fadvise")
    spec = compose_spec(["dataset=image_folder", f"dataset.path={_jpegs(tmp_path / 'imgs', 40)}", "dataset.cache=cold",
                         "run=quick", "run.profile_steps=0", "run.progress=false", "loader.batch_size=4",
                         "transform.per_sample=[{_target_:torchvision.transforms.PILToTensor}]"])
    summary = measure_job(spec, tmp_path).summary
    notices = [line for line in capsys.readouterr().out.splitlines() if "posix_fadvise" in line]
    assert len(notices) == 1 and "goes on warm" in notices[0]
    assert summary.cache_mode == "warm"
    assert "cold asked, ran warm" in summary.storage_note
    assert summary.read_files_per_sample == 1.0


# The warm-up's bound in these tests: far past a look at a small file or a 1 MiB read here, and
# short enough to wait out.
WARM_BOUND_S = 1.0


class _Files:
    """A dataset that reads `paths` through pipebench, as the warm-up sees one."""

    def __init__(self, paths):
        self.paths = [str(path) for path in paths]
        self.reads = FileReads()

    def files(self):
        return self.paths


def _fifo_and_dev_zero(folder):
    """A FIFO with no writer (opening it to read blocks) and a link to /dev/zero (a read that never
    ends), both named like images."""
    fifo, zero = folder / "pipe.jpg", folder / "zero.jpg"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    return fifo, zero


def test_the_warm_up_reads_only_regular_files_and_counts_the_others(tmp_path, monkeypatch):
    (blob,) = _blobs(tmp_path, 1, 4096)
    fifo, zero = _fifo_and_dev_zero(tmp_path)
    warmed, warm_file = [], page_cache._warm_file
    monkeypatch.setattr(page_cache, "_warm_file",
                        lambda path, watchdog: warmed.append(path) or warm_file(path, watchdog))
    with Watchdog(WARM_BOUND_S, STEP_TIMEOUT_KEY, on_stuck=print) as watchdog:
        plan = prepare_cache(_Files([blob, fifo, zero]), StorageSpec(), available_bytes=100 * MIB, watchdog=watchdog)
    assert warmed == [blob]
    skipped = [line for line in plan.notices if "skipped" in line]
    assert len(skipped) == 1 and "skipped 2 of the dataset's files that are no regular file, not read" in skipped[0]
    assert f"{fifo} and 1 more" in skipped[0] and "skipped 2" in plan.columns()["storage_note"]


def test_a_fifo_or_device_put_in_since_the_look_is_not_read(tmp_path):
    """The open does not wait for a FIFO's writer, and what is no regular file once open is left unread."""
    fifo, zero = _fifo_and_dev_zero(tmp_path)
    with Watchdog(WARM_BOUND_S, STEP_TIMEOUT_KEY, on_stuck=print) as watchdog:
        assert page_cache._warm_file(str(fifo), watchdog) is False
        assert page_cache._warm_file(str(zero), watchdog) is False


def test_a_warm_up_read_that_stalls_ends_the_job_in_one_line_naming_the_file(tmp_path, monkeypatch):
    """The stall is a real blocking read: a FIFO whose writer holds it open and never writes, read
    in place of the image file's chunks, as a network filesystem gone quiet holds a read."""
    from pipebench.measure.job import measure_job

    folder = _jpegs(tmp_path / "imgs", 2).resolve()
    fifo = tmp_path / "quiet"
    os.mkfifo(fifo)
    quiet = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY)
    os.set_blocking(quiet, True)
    warm_file = page_cache._warm_file
    monkeypatch.setattr(page_cache, "_warm_file",
                        lambda path, watchdog: warm_file(path, watchdog, read=lambda fd, size: os.read(quiet, size)))
    spec = compose_spec(["dataset=image_folder", f"dataset.path={folder}", "run=quick", "run.progress=false",
                         "loader.batch_size=2", f"run.step_timeout_s={WARM_BOUND_S / 2:g}", "run.profile_steps=0",
                         "transform.per_sample=[{_target_:torchvision.transforms.PILToTensor}]"])
    start = time.monotonic()
    try:
        with pytest.raises(StepTimeoutError) as exc_info:
            measure_job(spec, tmp_path)
    finally:
        os.close(quiet)
        os.close(writer)
    assert time.monotonic() - start < 10 * WARM_BOUND_S
    message = str(exc_info.value)
    assert "\n" not in message
    assert message.startswith(f"page-cache warm-up: reading {folder / '0.jpg'} ran past "
                              f"{STEP_TIMEOUT_KEY}={WARM_BOUND_S / 2:g}; stopped the job")


def test_the_storage_keys_leave_the_dataset_node():
    """The dataset class never sees `cache` or `storage`; the spec holds them."""
    spec = compose_spec(["dataset.cache=cold", "dataset.storage.latency_ms=5", "dataset.storage.mb_per_s=50"])
    assert "cache" not in spec.dataset and "storage" not in spec.dataset
    assert spec.storage == StorageSpec(cache="cold", latency_ms=5.0, mb_per_s=50.0)
    assert compose_spec([]).storage == StorageSpec()


BAD_STORAGE = [
    (["dataset.cache=lukewarm"], "dataset.cache"),
    (["dataset.storage.latency_ms=-1"], "dataset.storage.latency_ms"),
    (["dataset.storage.latency_ms=1e9"], "dataset.storage.latency_ms"),
    (["dataset.storage.latency_ms=nan"], "dataset.storage.latency_ms"),
    (["dataset.storage.latency_ms=slow"], "dataset.storage.latency_ms"),
    (["dataset.storage.mb_per_s=0"], "dataset.storage.mb_per_s"),
    (["dataset.storage.mb_per_s=-100"], "dataset.storage.mb_per_s"),
    (["dataset.storage.mb_per_s=1e12"], "dataset.storage.mb_per_s"),
]


@pytest.mark.parametrize("args,named", BAD_STORAGE)
def test_bad_storage_settings_exit_2_naming_the_key(args, named, capsys, tmp_path):
    assert_config_error_is_one_line(args, named, capsys, tmp_path)
