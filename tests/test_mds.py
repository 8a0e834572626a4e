"""dataset=mds: pipebench's reader of Mosaic's MDS format against golden shards written once by the real
`MDSWriter` (tests/fixtures/mds/, make_golden.py says how): every sample of the uncompressed, zstd and gz
sets byte for byte, split across ranks and workers exactly once, and bad input one line naming the
shard or left out and counted. Where mosaicml-streaming is installed, its StreamingDataset reads the
same samples."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from pipebench.base.errors import DatasetError
from pipebench.datasets import mds_shards
from pipebench.datasets.mds_shards import MDSShards, decode_int
from pipebench.pipeline.timed_chain import undecoded

GOLDEN = Path(__file__).parent / "fixtures" / "mds"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())
SETS = ("plain", "zstd", "gz")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _copy(tmp_path: Path, name: str = "plain") -> Path:
    return Path(shutil.copytree(GOLDEN / name, tmp_path / name))


@pytest.mark.parametrize("name", SETS)
def test_every_golden_sample_is_read_byte_for_byte(name):
    mds = MDSShards(str(GOLDEN / name))
    expected = EXPECTED[name]
    assert len(mds) == len(expected) and mds.shard_count() == 3
    rows = [row for shard in range(mds.shard_count()) for row in mds.shard_samples(shard)]
    assert [{"image_sha256": _sha(r["image"]), "blob_sha256": _sha(r["blob"]), "label": decode_int("int", r["label"]),
             "caption": r["caption"].decode("utf-8")} for r in rows] == \
        [{k: v for k, v in e.items() if k != "pixels_sha256"} for e in expected]
    read = list(mds)
    assert [index for index, _, _ in read] == list(range(len(expected)))
    assert [(_sha(image.fp.getvalue()), label) for _, image, label in read] == \
        [(e["image_sha256"], e["label"]) for e in expected]
    assert all(image.mode == "RGB" and undecoded(image) for _, image, _ in read), "the chain's decode step decodes it"
    pixels = MDSShards(str(GOLDEN / name), image_key="pixels", label_key=None)
    assert [(_sha(image.tobytes()), label) for _, image, label in pixels] == \
        [(e["pixels_sha256"], 0) for e in expected], "a pil column's raw pixels, decoded in the dataset"


def test_the_identity_names_the_set_and_its_compression():
    identity = MDSShards(str(GOLDEN / "zstd")).identity()
    assert identity["shard_samples"] == [2, 2, 1] and identity["num_samples"] == 5
    assert identity["compression"] == ["zstd"] and "skipped" not in identity


def test_the_shards_split_across_ranks_and_workers_and_every_sample_is_read_once(monkeypatch):
    """2 ranks x 2 workers over 3 shards, as webdataset splits tar shards: rank 1 worker 1 gets none."""
    mds = MDSShards(str(GOLDEN / "gz"))
    pooled, loads = [], []
    for rank in range(2):
        for worker in range(2):
            monkeypatch.setattr(mds_shards, "reader_position", lambda rank=rank, worker=worker: (rank, 2, worker, 2))
            read = [index for index, _, _ in mds]
            pooled += read
            loads.append(len(read))
    assert sorted(pooled) == list(range(5)) and loads == [2, 1, 2, 0]


def test_no_shard_left_under_skip_is_one_line_naming_the_first_left_out(tmp_path):
    root = _copy(tmp_path)
    for shard in root.glob("*.mds"):
        shard.unlink()
    with pytest.raises(DatasetError) as raised:
        MDSShards(str(root), on_bad_sample="skip")
    assert str(raised.value) == f"mds: no samples in {root} ({root}/shard.00000.mds: no such shard (listed in index.json))"


def test_a_truncated_shard_is_one_line_or_left_out_and_counted(tmp_path):
    root = _copy(tmp_path)
    shard = root / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(DatasetError, match=r"^mds: .*shard\.00001\.mds: truncated shard: \d+ bytes where index\.json "
                                           r"says \d+; dataset\.on_bad_sample=skip leaves it out$"):
        MDSShards(str(root))
    kept = MDSShards(str(root), on_bad_sample="skip")
    assert len(kept) == 3 and kept.identity()["skipped"] == {"shards": 1}
    assert "left out 1 bad input(s)" in kept.notes()[0]
    assert sorted(_sha(image.fp.getvalue()) for _, image, _ in kept) == \
        sorted(e["image_sha256"] for k, e in enumerate(EXPECTED["plain"]) if k not in (2, 3))


def test_an_offsets_table_that_does_not_fit_its_shard_is_named(tmp_path):
    root = _copy(tmp_path)
    shard = root / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    data[0] = 9  # the sample count
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match="shard.00000.mds: not an MDS shard: it holds 9 samples where index.json "
                                           "says 2"):
        MDSShards(str(root))


def test_a_damaged_compressed_shard_is_one_line_when_read(tmp_path):
    """A compressed shard is checked by its size before any job, and read whole, bounded, when a job reads it."""
    root = _copy(tmp_path, "zstd")
    shard = root / "shard.00001.mds.zstd"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2:] = bytes(len(data) - len(data) // 2)
    shard.write_bytes(bytes(data))
    mds = MDSShards(str(root))
    with pytest.raises(DatasetError, match=r"shard\.00001\.mds\.zstd: not a readable zstd shard"):
        list(mds)


def test_an_index_that_names_a_shard_outside_its_folder_is_refused(tmp_path):
    root = _copy(tmp_path)
    (tmp_path / "secret.mds").write_bytes((root / "shard.00002.mds").read_bytes())
    index = json.loads((root / "index.json").read_text())
    index["shards"][2]["raw_data"]["basename"] = "../secret.mds"
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(DatasetError, match=r"'\.\./secret\.mds', outside the folder: not read"):
        MDSShards(str(root))
    assert len(MDSShards(str(root), on_bad_sample="skip")) == 4


@pytest.mark.parametrize("change, line", [
    ({"image_key": "photo"}, r"no column 'photo' \(dataset\.image_key; it has blob \(bytes\), caption \(str\), "),
    ({"label_key": "caption"}, r"column 'caption' holds str, not one of int, .*\(dataset\.label_key\)"),
])
def test_columns_that_give_no_image_or_label_are_named(change, line):
    with pytest.raises(DatasetError, match=line):
        MDSShards(str(GOLDEN / "plain"), **change)


def test_a_folder_without_an_mds_index_is_one_line(tmp_path):
    with pytest.raises(DatasetError, match="no index.json, so no MDS set"):
        MDSShards(str(tmp_path))
    (tmp_path / "index.json").write_text('{"version": 1, "shards": []}')
    with pytest.raises(DatasetError, match=r"index\.json: not an MDS index \(no version 2 index of shards\)"):
        MDSShards(str(tmp_path))


def test_streamings_own_reader_gives_the_same_samples(tmp_path):
    """mosaicml-streaming pins numpy<2.2, so it is not in pipebench's environment; where a user has it,
    its StreamingDataset (which decompresses into its folder, so it reads a copy) must agree."""
    streaming = pytest.importorskip("streaming")
    for name in SETS:
        ours = [row for mds in [MDSShards(str(GOLDEN / name))] for k in range(mds.shard_count())
                for row in mds.shard_samples(k)]
        theirs = streaming.StreamingDataset(local=str(_copy(tmp_path, name)), shuffle=False, batch_size=1)
        assert len(theirs) == len(ours)
        for k, row in enumerate(ours):
            sample = theirs[k]
            assert sample["image"].fp.getvalue() == row["image"] and sample["blob"] == row["blob"]
            assert sample["label"] == decode_int("int", row["label"]) and sample["caption"] == row["caption"].decode()
