"""Shard formats as the peer libraries write them with their own defaults, written by the real library in
the test itself: webdataset's ShardWriter, Hugging Face `datasets` (embedded bytes, paths, PIL images)
and `litdata.optimize` (bytes, PIL images, JPEG files, litdata's typed Image). Each is read with every
sample exactly once; LitData's index is checked against its chunks before any job, and a bucket that
refuses access, or an endpoint litdata cannot use, is one line naming it."""

import json
import logging
import os
import shutil

import fault_transforms
import numpy as np
import pytest
from conftest import NO_PROFILE, results_folder, run_cli
from PIL import Image
from torch.utils.data import DataLoader

from pipebench.base.errors import DatasetError
from pipebench.datasets.litdata_chunks import LitDataChunks
from pipebench.datasets.parquet_rows import parquet_dataset
from pipebench.datasets.webdataset_shards import WebDatasetShards
from pipebench.pipeline.sweep_check import plan_lines
from pipebench.pipeline.timed_chain import undecoded

IMAGES, PER_SHARD = 6, 4
# A pixel's channel may move this much through a JPEG round trip of a flat colour.
JPEG_SLACK = 3


def _pixels(number: int) -> np.ndarray:
    """Image `number`: a flat colour of its own, 10x8."""
    return np.full((8, 10, 3), (number * 40, 255 - number * 30, 90), np.uint8)


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """IMAGES JPEG files and their bytes; image k has label k % 3."""
    folder = tmp_path_factory.mktemp("jpegs")
    paths = []
    for number in range(IMAGES):
        path = folder / f"{number}.jpg"
        Image.fromarray(_pixels(number)).save(path, quality=95)
        paths.append(str(path))
    return paths, [open(path, "rb").read() for path in paths]


def _every_index_once(dataset, workers: int = 2) -> list:
    """The (index, image, label) samples of an IterableDataset in index order, read in this process
    (a worker's pickled image arrives decoded), once its indices, read by `workers` DataLoader workers
    in batches of 4 with the last kept (drop_last=false), are checked to hold each index exactly once."""
    loader = DataLoader(dataset, batch_size=4, num_workers=workers, drop_last=False,
                        collate_fn=lambda batch: [index for index, _, _ in batch])
    assert sorted(index for batch in loader for index in batch) == list(range(IMAGES)), "every sample once"
    samples = sorted(dataset, key=lambda sample: sample[0])
    assert [index for index, _, _ in samples] == list(range(IMAGES))
    return samples


def _encoded(image) -> bytes:
    assert undecoded(image), "the chain gets the encoded image, so its decode is a timed step"
    return image.fp.getvalue()


def test_webdataset_shards_written_by_shardwriter(jpegs, tmp_path):
    import webdataset as wds

    with wds.ShardWriter(str(tmp_path / "train-%06d.tar"), maxcount=PER_SHARD) as sink:
        for number, data in enumerate(jpegs[1]):
            sink.write({"__key__": f"sample{number:04d}", "jpg": data, "cls": number % 3})
    shards = WebDatasetShards(str(tmp_path / "train-{000000..000001}.tar"))
    samples = _every_index_once(shards)
    assert [(_encoded(image), label) for _, image, label in samples] == \
        [(data, number % 3) for number, data in enumerate(jpegs[1])]


def _hf_files(jpegs, folder):
    """HF `datasets`' own Parquet files: file paths cast to Image (bytes null, path set), PIL images
    opened from those files (HF keeps their path too), and PIL images built in memory (HF embeds their
    PNG bytes)."""
    from datasets import Dataset
    from datasets import Image as ImageFeature

    labels = [number % 3 for number in range(IMAGES)]
    paths, opened, embedded = folder / "paths.parquet", folder / "opened.parquet", folder / "embedded.parquet"
    Dataset.from_dict({"image": jpegs[0], "label": labels}).cast_column("image", ImageFeature()).to_parquet(paths)
    Dataset.from_dict({"image": [Image.open(path) for path in jpegs[0]], "label": labels}).to_parquet(opened)
    Dataset.from_dict({"image": [Image.fromarray(_pixels(n)) for n in range(IMAGES)], "label": labels}).to_parquet(embedded)
    return paths, opened, embedded


@pytest.mark.slow
def test_hugging_face_parquet_with_paths_opened_images_and_embedded_bytes(jpegs, tmp_path):
    # A submodule of HF's alone: the repo's own datasets/ folder, were it on sys.path, has none.
    pytest.importorskip("datasets.arrow_dataset", reason="HF datasets writes the files: pip install '.[test]'")
    logging.getLogger("datasets").setLevel(logging.WARNING)
    paths, opened, embedded = _hf_files(jpegs, tmp_path)
    labels = [number % 3 for number in range(IMAGES)]
    for by_path in (paths, opened):
        rows = parquet_dataset(str(by_path))
        assert [(_encoded(rows[i][0]), rows[i][1]) for i in range(IMAGES)] == list(zip(jpegs[1], labels))
        stream = _every_index_once(parquet_dataset(str(by_path), streaming=True), workers=1)
        assert [_encoded(image) for _, image, _ in stream] == jpegs[1]
        assert f"({by_path}) names images by path, not bytes" in plan_lines([], [rows])[1][0]
    rows = parquet_dataset(str(embedded))
    assert [np.array_equal(np.asarray(rows[n][0]), _pixels(n)) for n in range(IMAGES)] == [True] * IMAGES
    assert rows.plan_notes() == (), "embedded bytes: nothing to say"


def test_hf_paths_relative_to_the_parquet_file_and_a_missing_one_checked_before_any_job(jpegs, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "img").mkdir()
    for number, path in enumerate(jpegs[0]):
        shutil.copy(path, tmp_path / "img" / f"{number}.jpg")
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    rows = [{"bytes": None, "path": f"img/{n}.jpg"} for n in range(IMAGES)]
    rows[1] = {"bytes": jpegs[1][1], "path": None}
    table = pa.table({"image": pa.array(rows, image_type), "label": list(range(IMAGES))})
    pq.write_table(table, tmp_path / "rel.parquet", row_group_size=4)
    read = parquet_dataset(str(tmp_path / "rel.parquet"))
    assert [_encoded(read[n][0]) for n in range(IMAGES)] == jpegs[1]
    (tmp_path / "img" / "5.jpg").unlink()
    with pytest.raises(DatasetError, match=rf"row group 1, row 1: column 'image' has no image bytes and its path "
                                           rf"names {tmp_path / 'img' / '5.jpg'}, no such file"):
        parquet_dataset(str(tmp_path / "rel.parquet"))
    rows[5] = {"bytes": None, "path": None}
    pq.write_table(pa.table({"image": pa.array(rows, image_type), "label": list(range(IMAGES))}), tmp_path / "none.parquet")
    with pytest.raises(DatasetError, match="row 5: column 'image' holds neither image bytes nor a path"):
        parquet_dataset(str(tmp_path / "none.parquet"))
    shutil.copy(jpegs[0][5], tmp_path / "img" / "5.jpg")
    kept = parquet_dataset([str(tmp_path / "none.parquet"), str(tmp_path / "rel.parquet")], on_bad_sample="skip")
    assert len(kept) == IMAGES and kept.identity()["skipped"] == {"files": 1}


def _item(number: int, paths: list) -> dict:
    """One item as a user's `litdata.optimize` function returns it, with no index field: the image as
    a PIL image built in memory (litdata's pil serializer), a JPEG opened from its file (jpeg: the
    file's bytes), the file's bytes, and litdata's typed Image of the path (image:jpg)."""
    import litdata.types

    with open(paths[number], "rb") as f:
        data = f.read()
    return {"pil": Image.fromarray(_pixels(number)), "jpeg": Image.open(paths[number]), "bytes": data,
            "typed": litdata.types.Image(path=paths[number]), "label": number % 3}


@pytest.fixture(scope="module")
def optimized(jpegs, tmp_path_factory):
    """The items written by the real `litdata.optimize`: one worker, forked (a spawned one imports
    torch again, seconds), chunks of PER_SHARD items."""
    import functools

    import litdata

    out = tmp_path_factory.mktemp("optimized") / "set"
    litdata.optimize(fn=functools.partial(_item, paths=jpegs[0]), inputs=list(range(IMAGES)), output_dir=str(out),
                     chunk_size=PER_SHARD, num_workers=1, start_method="fork", verbose=False)
    return out


def test_litdata_optimize_every_image_serializer_read_once_across_workers(optimized, jpegs):
    labels = [number % 3 for number in range(IMAGES)]
    for key in ("jpeg", "bytes", "typed"):
        chunks = LitDataChunks(str(optimized), image_key=key, shuffle=True)
        assert chunks.identity()["index_read"] == "position" and chunks.plan_notes() == ()
        samples = _every_index_once(chunks)
        assert [(_encoded(image), label) for _, image, label in samples] == list(zip(jpegs[1], labels)), key
    pil = LitDataChunks(str(optimized), image_key="pil")
    samples = _every_index_once(pil)
    assert all(np.array_equal(np.asarray(image), _pixels(n)) for n, (_, image, _) in enumerate(samples))
    assert not undecoded(samples[0][1]) and pil.identity()["image_format"] == "pil"
    assert "holds litdata's pil serializer (raw pixels, no encoded file)" in pil.plan_notes()[0]
    assert "the decode is in the dataset's load row" in pil.plan_notes()[0]
    unlabelled = LitDataChunks(str(optimized), image_key="jpeg", label_key="target")
    assert "items have no field 'target' (dataset.label_key), so every label is 0" in unlabelled.plan_notes()[0]
    with pytest.raises(DatasetError, match=r"items have no image field 'label' \(dataset.image_key; one of "
                                           r"litdata's bytes, jpeg, image, pil serializers; fields: pil \(pil\), "
                                           r"jpeg \(jpeg\), bytes \(bytes\), typed \(image:jpg\), label \(int\)\)"):
        LitDataChunks(str(optimized), image_key="label")


def _edited(optimized, folder, edit) -> str:
    """A copy of the optimized set whose index.json `edit` has changed."""
    shutil.copytree(optimized, folder)
    index = json.loads((folder / "index.json").read_text())
    edit(index)
    (folder / "index.json").write_text(json.dumps(index))
    return str(folder)


def test_litdata_index_checked_against_its_chunks_before_any_job(optimized, tmp_path):
    huge = _edited(optimized, tmp_path / "huge", lambda index: index["chunks"][0].update(chunk_size=10 ** 12))
    with pytest.raises(DatasetError, match=rf"{huge}/chunk-0-0.bin: index.json says it holds 1000000000000 items, "
                                           r"whose count and offsets alone take 4000000000008 bytes, but the file has"):
        LitDataChunks(huge, image_key="jpeg")
    escape = _edited(optimized, tmp_path / "escape", lambda index: index["chunks"][1].update(filename="../escape.bin"))
    shutil.copy(optimized / "chunk-0-1.bin", tmp_path / "escape.bin")
    with pytest.raises(DatasetError, match=r"index.json: chunk name '../escape.bin' leaves the folder, so not read"):
        LitDataChunks(escape, image_key="jpeg")
    fifo = _edited(optimized, tmp_path / "fifo", lambda index: None)
    os.remove(f"{fifo}/chunk-0-1.bin")
    os.mkfifo(f"{fifo}/chunk-0-1.bin")
    with pytest.raises(DatasetError, match=rf"{fifo}/chunk-0-1.bin: not a regular file but a FIFO: not read"):
        LitDataChunks(fifo, image_key="jpeg")
    os.remove(f"{fifo}/chunk-0-1.bin")
    os.symlink("/dev/zero", f"{fifo}/chunk-0-1.bin")
    with pytest.raises(DatasetError, match=r"chunk-0-1.bin: not a regular file but a character device \(a link to "
                                           r"/dev/zero\)"):
        LitDataChunks(fifo, image_key="jpeg")
    os.remove(f"{fifo}/index.json")
    os.mkfifo(f"{fifo}/index.json")
    with pytest.raises(DatasetError, match=rf"{fifo}/index.json: not a regular file but a FIFO: not read"):
        LitDataChunks(fifo, image_key="jpeg")


@pytest.fixture
def bucket(optimized, monkeypatch):
    """moto's S3 server on the loopback (plain http, as a MinIO or moto endpoint is), botocore pointed at
    it, and the optimized set uploaded under s3://peer/set."""
    moto_server = pytest.importorskip("moto.server", reason="the S3 case needs moto's server: pip install '.[test]'")
    s3fs = pytest.importorskip("s3fs")
    monkeypatch.setattr(logging, "raiseExceptions", False)  # werkzeug's request log, as test_object_store says
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for key, value in (("AWS_ENDPOINT_URL", f"http://{host}:{port}"), ("AWS_ACCESS_KEY_ID", "testing"),
                       ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1"),
                       ("AWS_MAX_ATTEMPTS", "1")):
        monkeypatch.setenv(key, value)
    for key in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("peer")
    fs.put(f"{optimized}/", "peer/set/", recursive=True)
    yield f"http://{host}:{port}"
    s3fs.S3FileSystem.clear_instance_cache()  # no later test may reuse a client of a stopped server
    server.stop()


@pytest.mark.slow
def test_litdata_in_a_bucket_names_the_http_endpoint_and_a_403_as_access_denied(bucket, monkeypatch):
    from moto import settings

    with pytest.raises(DatasetError) as caught:
        LitDataChunks("s3://peer/set", image_key="jpeg")
    assert str(caught.value) == (f"litdata: s3://peer/set: the endpoint {bucket} is plain http, which litdata's "
                                 "downloader (obstore) refuses (BadScheme): litdata reads a bucket only through an "
                                 "https:// endpoint (AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL) or AWS's own")
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # credentials checked from now: 'testing' is none
    with pytest.raises(DatasetError) as caught:
        LitDataChunks("s3://peer/set", image_key="jpeg")
    line = str(caught.value)
    assert line.startswith("litdata: s3://peer/set/index.json: access denied (") and "\n" not in line
    assert "not a LitData index" not in line and "AWS_ACCESS_KEY_ID" in line


@pytest.mark.slow
def test_a_run_over_litdata_pixels_says_where_the_decode_is_and_reads_every_position_once(optimized, tmp_path):
    """One whole `pipebench run` at workers=2, drop_last=false, over the optimize set's `pil` field: the
    plan-time note once, and the job's exactly-once check over items known by their position. The chain
    makes the image an array with fault_transforms.ToArray, in the run's folder: torchvision's
    PILToTensor cost the job process seconds of imports."""
    shutil.copy(fault_transforms.__file__, tmp_path)
    done = run_cli(["run", "dataset=litdata", f"dataset.input_dir={optimized}", "dataset.image_key=pil", "workers=2",
                    "run=quick", "consumer=none", "loader.batch_size=4", "loader.drop_last=false", "run.progress=false",
                    "run.warmup_steps=0", "run.min_time_s=0", "transform.per_batch=[]",
                    f"transform.per_sample=[{{_target_:{fault_transforms.__name__}.ToArray}}]",
                    *NO_PROFILE, f"results_dir={tmp_path}"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if "holds litdata's pil serializer" in line]
    assert len(notes) == 1 and notes[0].startswith("note: litdata: "), done.stderr
    job = json.loads((results_folder(done.stdout) / "job-0" / "result.json").read_text())
    assert job["coverage"]["exactly_once"] and job["coverage"]["length"] == IMAGES
    assert job["fingerprint"]["dataset"]["index_read"] == "position"
