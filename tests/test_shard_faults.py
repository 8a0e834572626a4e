"""Shard faults that lost data silently or hung: a tar cut at a member boundary (no end-of-archive marker),
a tar member too large to read into memory, and a FIFO or a link to /dev/zero where a shard, a Parquet
file or an index belongs. Each is one line naming the file before any job, or, under
on_bad_sample=skip, left out and counted; none hangs. Datasets are built directly, no CLI job."""

import io
import os
import shutil
import signal
import tarfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from PIL import Image

from pipebench.base.errors import DatasetError
from pipebench.datasets.litdata_chunks import LitDataChunks
from pipebench.datasets.mds_shards import MDSShards
from pipebench.datasets.parquet_rows import parquet_dataset
from pipebench.datasets.shard_split import not_regular
from pipebench.datasets.webdataset_shards import WebDatasetShards

SHARDS, PER_SHARD = 4, 4
PATTERN = "shard-{000000..000003}.tar"
# A FIFO opened for reading waits for a writer: a build that opens one never ends. Far above a build's time.
HANG_S = 20
MDS_PLAIN = Path(__file__).parent / "fixtures" / "mds" / "plain"


@contextmanager
def _ends_within(seconds: int):
    """Fails the test, instead of hanging it, when the block has not ended after `seconds`."""
    def hang(signum, frame):
        raise AssertionError(f"still running after {seconds} s: it waits on a FIFO or reads a device")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 60)).save(out, "JPEG")
    return out.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """4 tar shards of 4 samples (key.jpg + key.cls), written by webdataset's own ShardWriter."""
    import webdataset as wds

    root = tmp_path_factory.mktemp("wds")
    image = _jpeg()
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for k in range(SHARDS * PER_SHARD):
            sink.write({"__key__": f"{k:08d}", "jpg": image, "cls": b"1"})
    return root


def _copy_cut(root: Path, tmp_path: Path, cut) -> Path:
    """The shards copied, the last one rewritten by `cut(bytes, its last-but-one sample's end)`."""
    out = Path(shutil.copytree(root, tmp_path / "cut"))
    last = out / f"shard-{SHARDS - 1:06d}.tar"
    with tarfile.open(last) as tar:
        member = tar.getmembers()[-3]  # the third sample's last member: three whole samples before the cut
    end = member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    last.write_bytes(cut(last.read_bytes(), end))
    return out


CUTS = {
    "just after a member": (lambda data, end: data[:end],
                            r"truncated tar: no end-of-archive marker: it ends after member 00000014\.jpg, cut just "
                            r"after it"),
    "100 bytes into the next header": (lambda data, end: data[:end + 100],
                                       r"truncated tar: no end-of-archive marker: it ends after member 00000014\.jpg, "
                                       r"cut 100 bytes into the next header"),
    "a damaged header after a member": (lambda data, end: data[:end] + b"\x01" * (len(data) - end),
                                        r"not a readable tar after member 00000014\.jpg: the header at byte \d+ is "
                                        r"damaged"),
}


@pytest.mark.parametrize("case", list(CUTS))
def test_a_tar_cut_at_a_member_boundary_is_truncated_under_fail_and_skip(shards, tmp_path, case):
    """Python's tarfile reads such a shard as 3 whole samples and stops, with no word: the scan looks for the
    end-of-archive marker itself."""
    cut, line = CUTS[case]
    urls = str(_copy_cut(shards, tmp_path, cut) / PATTERN)
    with pytest.raises(DatasetError) as caught:
        WebDatasetShards(urls)
    assert "\n" not in str(caught.value)
    assert caught.match(rf"^webdataset: \S+shard-000003\.tar: {line}.*; dataset\.on_bad_sample=skip leaves it out$")
    kept = WebDatasetShards(urls, on_bad_sample="skip")
    assert len(kept) == (SHARDS - 1) * PER_SHARD and kept.identity()["skipped"] == {"shards": 1}
    assert "shard-000003.tar: " in kept.notes()[0] and "left out 1 bad input(s)" in kept.notes()[0]


def test_a_whole_shard_set_reads_every_sample(shards):
    """The control: the shards as written have their end-of-archive marker and read whole."""
    assert len(WebDatasetShards(str(shards / PATTERN))) == SHARDS * PER_SHARD


def test_a_member_over_the_limit_is_refused_naming_it_and_its_shard(tmp_path):
    shard = tmp_path / "big.tar"
    with tarfile.open(shard, "w") as tar:
        for name, data in (("a.jpg", _jpeg()), ("b.jpg", bytes((1 << 20) + 1))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DatasetError, match=rf"^webdataset: {shard}: member b\.jpg holds 1048577 bytes, over the 1 MiB "
                                           r"dataset\.max_member_mb allows \(webdataset reads a member whole"):
        WebDatasetShards(str(shard), label_ext=None, max_member_mb=1)
    assert len(WebDatasetShards(str(shard), label_ext=None, max_member_mb=2)) == 2
    for bad in (0, True, 10**6, "1"):
        with pytest.raises(DatasetError, match=r"max_member_mb must be an integer in \[1, 65536\]"):
            WebDatasetShards(str(shard), max_member_mb=bad)


def _dev_zero_link(path: Path) -> Path:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")
    return path


def test_a_fifo_or_a_link_to_dev_zero_where_a_shard_belongs_is_named_not_read(shards, tmp_path):
    root = Path(shutil.copytree(shards, tmp_path / "odd"))
    (root / "shard-000001.tar").unlink()
    os.mkfifo(root / "shard-000001.tar")
    _dev_zero_link(root / "shard-000002.tar")
    urls = str(root / PATTERN)
    with _ends_within(HANG_S), pytest.raises(DatasetError, match=r"shard-000001\.tar: not a regular file but a FIFO: "
                                                                  r"not read .*\(and 1 more\)"):
        WebDatasetShards(urls)
    with _ends_within(HANG_S):
        kept = WebDatasetShards(urls, on_bad_sample="skip")
    assert len(kept) == 2 * PER_SHARD and kept.identity()["skipped"] == {"shards": 2}
    assert "shard-000002.tar: not a regular file but a character device (a link to /dev/zero)" in kept.notes()[0]


def test_mds_reads_no_fifo_index_and_no_shard_linked_to_dev_zero(tmp_path):
    root = Path(shutil.copytree(MDS_PLAIN, tmp_path / "mds"))
    _dev_zero_link(root / "shard.00001.mds")
    with pytest.raises(DatasetError, match=r"shard\.00001\.mds: not a regular file but a character device \(a link to "
                                           r"/dev/zero\)"):
        MDSShards(str(root))
    assert len(MDSShards(str(root), on_bad_sample="skip")) == 3
    (root / "index.json").unlink()
    os.mkfifo(root / "index.json")
    with _ends_within(HANG_S), pytest.raises(DatasetError, match=r"^mds: \S+/index\.json: not a regular file but a "
                                                                  r"FIFO: not read"):
        MDSShards(str(root))


def test_parquet_and_litdata_read_no_fifo_where_their_file_or_index_belongs(tmp_path):
    os.mkfifo(tmp_path / "part-00000.parquet")
    with _ends_within(HANG_S), pytest.raises(DatasetError, match=r"part-00000\.parquet: not a regular file but a "
                                                                  r"FIFO: not read"):
        parquet_dataset(str(tmp_path / "*.parquet"))
    os.mkfifo(tmp_path / "index.json")
    with _ends_within(HANG_S), pytest.raises(DatasetError, match=r"index\.json: not a regular file"):
        LitDataChunks(str(tmp_path))


def test_not_regular_names_what_a_file_is_and_passes_files_urls_and_missing_paths(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert [not_regular(str(p)) for p in (tmp_path / "f", tmp_path / "link", tmp_path / "none")] == ["", "", ""]
    assert not_regular("s3://bucket/shard.tar") == ""
    assert not_regular(str(tmp_path)).startswith("not a regular file but a folder")
    assert not_regular(f"file://{_dev_zero_link(tmp_path / 'zero')}").startswith(
        "not a regular file but a character device (a link to /dev/zero)")
