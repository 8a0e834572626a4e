"""`dataset convert`'s WebDataset shards: plain ustar members, with no PAX header for every reader to parse."""

import tarfile

import pytest

pytest.importorskip("webdataset")

from pipebench.datasets.webdataset_shards import WebDatasetShards, write_shards  # noqa: E402


def test_convert_writes_members_without_a_pax_header_and_reads_them_back(tmp_path):
    samples = [(f"img{k}.jpeg", bytes([k]) * 700, k) for k in range(3)]
    shards = write_shards(samples, tmp_path, shard_size=2)
    members = [m for shard in shards for m in tarfile.open(shard).getmembers()]
    assert [m.name for m in members] == ["00000000.cls", "00000000.jpg", "00000001.cls", "00000001.jpg",
                                         "00000002.cls", "00000002.jpg"]
    # A float mtime (webdataset's default) would put an extended header before each member.
    assert all(m.pax_headers == {} and isinstance(m.mtime, int) for m in members)
    assert len(WebDatasetShards(sorted(shards))) == 3
