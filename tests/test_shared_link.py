"""The host's shared link: workers and ranks together read at its bandwidth, not at it each."""

import multiprocessing
import os
import pickle

import pytest
from conftest import compose_spec

from pipebench.base.errors import ConfigError
from pipebench.config.specs import StorageSpec
from pipebench.storage.file_reads import READ_BYTES, READ_FILES, FileReads
from pipebench.storage.shared_link import BYTES_PER_MB, SharedLink, opened_link

MB_PER_S = 50.0
SIZE = 1 << 20  # one MiB a read: 20 ms on the link
READS = 20
PROCESSES = 3


def _no_sleep(seconds: float) -> None:
    return None


def _reserve_all(link: SharedLink, queue) -> None:
    queue.put([link.reserve(SIZE) for _ in range(READS)])


def _schedules(link: SharedLink, method: str):
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    procs = [context.Process(target=_reserve_all, args=(link, queue)) for _ in range(PROCESSES)]
    for proc in procs:
        proc.start()
    found = [queue.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    return [slot for schedule in found for slot in schedule]


# spawn imports pipebench afresh in each process (~2 s on 2 cores): slow.
@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_processes_reading_at_once_share_one_bandwidth(tmp_path, method):
    """3 processes reserving at once get M in total: their reservations never overlap and each lasts
    size / M, whatever the load (the schedule, not the wall clock, is checked)."""
    path = tmp_path / "link"
    path.write_bytes(b"")
    slots = sorted(_schedules(SharedLink(str(path), MB_PER_S, sleep=_no_sleep), method))
    assert len(slots) == PROCESSES * READS
    duration = SIZE / (MB_PER_S * BYTES_PER_MB)
    for start, end in slots:
        assert end - start == pytest.approx(duration)
    for (_, end), (start, _) in zip(slots, slots[1:]):
        assert start >= end - 1e-9  # disjoint: the link carries one read at a time
    assert slots[-1][1] - slots[0][0] >= PROCESSES * READS * duration - 1e-6


def test_a_per_read_sleep_would_overlap_so_the_check_can_fail(tmp_path):
    """Two separate links (a bandwidth each, the old what-if) overlap: the disjointness check sees it."""
    first, second = (SharedLink(str(tmp_path / name), MB_PER_S, sleep=_no_sleep) for name in ("a", "b"))
    for link in (first, second):
        open(link.path, "wb").close()
    a, b = first.reserve(SIZE), second.reserve(SIZE)
    assert max(a[0], b[0]) < min(a[1], b[1])


def test_transfer_sleeps_until_its_reservation_ends():
    now = [100.0]
    slept = []
    link = SharedLink(None, MB_PER_S, clock=lambda: now[0], sleep=slept.append)
    link.transfer(SIZE)
    link.transfer(SIZE)  # queued behind the first: it ends two reads' time after now
    duration = SIZE / (MB_PER_S * BYTES_PER_MB)
    assert slept == [pytest.approx(duration), pytest.approx(2 * duration)]


def test_a_link_pickles_and_reopens_its_file_in_the_new_process(tmp_path):
    path = tmp_path / "link"
    path.write_bytes(b"")
    link = SharedLink(str(path), MB_PER_S, sleep=_no_sleep)
    link.reserve(SIZE)
    copy = pickle.loads(pickle.dumps(link))
    start, _ = copy.reserve(SIZE)
    assert start >= link.reserve(0)[0] - SIZE / (MB_PER_S * BYTES_PER_MB) - 1e-9


def test_a_sample_drawn_from_no_file_crosses_the_link_and_is_counted():
    slept = []
    reads = FileReads(StorageSpec(shared_mb_per_s=MB_PER_S), sleep=slept.append)
    reads.link.clock = lambda: 0.0
    before = reads.counts()
    reads.draw(SIZE)
    reads.draw(SIZE)
    row = reads.since(before)
    assert row[READ_BYTES] == 2 * SIZE and row[READ_FILES] == 2
    assert sum(slept) == pytest.approx(3 * SIZE / (MB_PER_S * BYTES_PER_MB))  # waits of 1 then 2 reads


def test_the_job_opens_one_link_file_and_removes_it():
    job_spec = compose_spec([])
    spec = compose_spec([f"dataset.storage.shared_mb_per_s={MB_PER_S}"])
    assert spec.storage.shared_mb_per_s == MB_PER_S
    with opened_link(spec) as linked:
        assert linked.storage.link is not None and os.path.exists(linked.storage.link)
        assert FileReads(linked.storage).link.path == linked.storage.link
    assert not os.path.exists(linked.storage.link)
    with opened_link(job_spec) as same:
        assert same is job_spec


@pytest.mark.parametrize("value", [0, -1, 1e9, "fast"])
def test_a_shared_bandwidth_out_of_range_is_one_line(value):
    with pytest.raises(ConfigError, match="dataset.storage.shared_mb_per_s"):
        compose_spec([f"dataset.storage.shared_mb_per_s={value}"])
