"""WebDataset shards, Parquet files and LitData chunks as datasets: `dataset convert` writes them, the readers give the
same images and labels, split across ranks and workers exactly once, the bad input is one line naming
the file and key (or left out and counted), and fewer shards than workers is said at plan time and in
the report. One whole `pipebench run` is shared by the tests that need one."""

import io
import json
import os
import shutil
import tarfile
from multiprocessing.pool import ThreadPool
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import NO_PROFILE, assert_config_error_is_one_line, results_folder, run_cli
from torch.utils.data import DataLoader

from pipebench.base.errors import ConfigError, DatasetError
from pipebench.cli.dataset import _run_command, convert
from pipebench.config.specs import StorageSpec
from pipebench.datasets import shard_split
from pipebench.datasets.litdata_chunks import LitDataChunks
from pipebench.datasets.mds_shards import MDSShards
from pipebench.datasets.parquet_rows import parquet_dataset
from pipebench.datasets.shard_split import ShardOffsets
from pipebench.datasets.webdataset_shards import WebDatasetShards
from pipebench.model.shards import idle_line, idle_readers, split
from pipebench.storage.page_cache import prepare_cache
from pipebench.measure.storage_io import file_read_figures
from pipebench.storage.file_reads import IO_FIELDS, FileReads
from pipebench.pipeline.timed_chain import undecoded

IMAGES, SHARD_SIZE, SHARDS = 16, 4, 4
# The corpus's own generator at a tiny size: 16 JPEGs of 32x32 in a cache of the test's own.
TINY_CORPUS = [f"dataset.num_images={IMAGES}", f"dataset.length={IMAGES}", "dataset.width=32", "dataset.height=32",
               "dataset.num_classes=3"]
PATTERN = "shard-{000000..000003}.tar"
# The whole run: 4 shards read at workers=0 and by 5 workers, one of which gets no shard.
RUN_WORKERS = 5
TO_TENSOR = "transform.per_sample=[{_target_:torchvision.transforms.PILToTensor}]"


def _collect(batches):
    return sorted(int(i) for batch in batches for i in batch)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The tiny corpus converted by `dataset convert` both ways, and the corpus's own files and labels."""
    root = tmp_path_factory.mktemp("formats")
    corpus = [*TINY_CORPUS, f"dataset.cache_dir={root / 'cache'}"]
    shards = convert("webdataset", root / "wds", SHARD_SIZE, corpus)
    files = convert("parquet", root / "pq", 2 * SHARD_SIZE, corpus)
    convert("litdata", root / "ld", SHARD_SIZE, corpus)
    from pipebench.config.compose import compose_job_spec
    from pipebench.pipeline.instantiate import instantiate_node

    source = instantiate_node(compose_job_spec(corpus).dataset, "dataset")
    truth = [(Path(source.describe(i)).read_bytes(), source[i][1]) for i in range(IMAGES)]
    return root, shards, files, truth


@pytest.fixture(scope="module")
def whole_run(written, tmp_path_factory):
    """One real `pipebench run dataset=webdataset` at workers=0 and 5 over the 4 shards."""
    root = written[0]
    out = tmp_path_factory.mktemp("run")
    done = run_cli(["run", "dataset=webdataset", f'dataset.urls="{root / "wds" / PATTERN}"', "run=quick",
                    f"workers=0,{RUN_WORKERS}", "consumer=none", "loader.batch_size=2", "run.progress=false",
                    "run.warmup_steps=0", "run.min_time_s=0", TO_TENSOR, "transform.per_batch=[]", *NO_PROFILE,
                    f"results_dir={out}"], cwd=out)
    assert done.returncode == 0, done.stderr
    folder = results_folder(done.stdout)
    jobs = [json.loads((folder / f"job-{k}" / "result.json").read_text()) for k in range(2)]
    return done, folder, jobs


@pytest.mark.slow
def test_convert_writes_each_format_with_the_same_images_and_labels(written):
    root, shards, files, truth = written
    assert [Path(s).name for s in shards] == [f"shard-{k:06d}.tar" for k in range(SHARDS)]
    assert len(files) == 2
    wds = WebDatasetShards(str(root / "wds" / PATTERN))
    read = sorted((index, image.fp.getvalue(), label) for index, image, label in wds)
    assert [(data, label) for _, data, label in read] == truth, "every image's bytes and label, in order"
    for streaming in (False, True):
        rows = parquet_dataset(str(root / "pq" / "*.parquet"), streaming=streaming)
        got = [(image.fp.getvalue(), label) for _, image, label in rows] if streaming else \
            [(rows[i][0].fp.getvalue(), rows[i][1]) for i in range(len(rows))]
        assert got == truth
    assert _run_command("webdataset", root / "wds", shards).endswith(f"'dataset.urls=\"{root / 'wds' / PATTERN}\"'")


def test_convert_refuses_a_folder_in_use_and_a_dataset_of_no_image_files(written, tmp_path):
    with pytest.raises(ConfigError, match="not an empty folder"):
        convert("parquet", written[0] / "pq", 8, TINY_CORPUS)
    with pytest.raises(ConfigError, match="RandomTensorDataset is not one"):
        convert("parquet", tmp_path / "out", 8, ["dataset=random_tensors"])
    assert not (tmp_path / "out").exists(), "nothing written for a dataset it cannot convert"


def test_the_chain_gets_the_encoded_image_so_the_decode_is_its_own_step(written):
    wds = WebDatasetShards(str(written[0] / "wds" / PATTERN))
    _, image, _ = next(iter(wds))
    assert image.mode == "RGB" and undecoded(image), "opened lazily: the chain's decode step decodes it"


def test_the_splitting_rule_is_webdatasets_and_every_sample_is_read_once(written, monkeypatch):
    """2 ranks x 3 workers over 4 shards: each reader takes the shards split_by_node then split_by_worker
    give it (webdataset's own), and pooled, every index arrives exactly once."""
    import webdataset as wds

    urls = str(written[0] / "wds" / PATTERN)
    pooled = []
    for rank in range(2):
        for worker in range(3):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", "2")
            monkeypatch.setenv("WORKER", str(worker))
            monkeypatch.setenv("NUM_WORKERS", "3")
            library = [s["url"] for s in wds.split_by_worker(wds.split_by_node({"url": u} for u in range(SHARDS)))]
            assert library == split(range(SHARDS), rank, 2, worker, 3)
            pooled += [index for index, _, _ in WebDatasetShards(urls)]
    assert sorted(pooled) == list(range(IMAGES))


def test_shuffled_streams_through_dataloader_workers_still_cover_every_index_once(written):
    dataset = WebDatasetShards(str(written[0] / "wds" / PATTERN), shuffle_buffer=8)
    loader = DataLoader(dataset, batch_size=None, num_workers=3, collate_fn=lambda item: item[0])
    assert sorted(loader) == list(range(IMAGES))
    order = [index for index, _, _ in dataset]
    assert sorted(order) == list(range(IMAGES)) and order != sorted(order), "the buffer shuffles"


def test_parquet_streaming_splits_row_groups_and_map_style_reads_under_threads(written, monkeypatch):
    files = str(written[0] / "pq" / "*.parquet")
    stream = parquet_dataset(files, streaming=True)
    assert stream.shard_count() == 2, "two files of one row group each"
    loader = DataLoader(stream, batch_size=None, num_workers=2, collate_fn=lambda item: item[0])
    assert sorted(loader) == list(range(IMAGES))
    rows = parquet_dataset(files)
    with ThreadPool(4) as pool:
        labels = pool.map(lambda i: rows[i][1], list(range(IMAGES)) * 3)
    assert labels == [rows[i][1] for i in range(IMAGES)] * 3, "each thread reads its own open files"
    maps = parquet_dataset(files)
    assert sorted(DataLoader(maps, batch_size=None, num_workers=2, collate_fn=lambda item: item[1])) == \
        sorted(label for _, label in [maps[i] for i in range(IMAGES)])


def test_parquet_reads_plain_binary_as_well_as_hfs_image_struct(tmp_path, written):
    truth = written[3]
    table = pa.table({"img": pa.array([data for data, _ in truth], pa.binary()), "y": [y for _, y in truth]})
    pq.write_table(table, tmp_path / "plain.parquet", row_group_size=5)
    rows = parquet_dataset(str(tmp_path / "plain.parquet"), image_column="img", label_column="y")
    assert [(rows[i][0].fp.getvalue(), rows[i][1]) for i in range(IMAGES)] == truth
    assert rows.describe(12) == f"{tmp_path / 'plain.parquet'}, row group 2, row 2"


def test_a_missing_shard_is_one_line_naming_it_or_left_out_and_counted(written):
    urls = [str(written[0] / "wds" / "shard-000000.tar"), str(written[0] / "wds" / "shard-000009.tar")]
    with pytest.raises(DatasetError, match=r"shard-000009.tar: no such shard; dataset.on_bad_sample=skip"):
        WebDatasetShards(urls)
    kept = WebDatasetShards(urls, on_bad_sample="skip")
    assert len(kept) == SHARD_SIZE and kept.identity()["skipped"] == {"shards": 1}
    assert kept.notes() == (f"webdataset: on_bad_sample=skip left out 1 bad input(s): {urls[1]}: no such shard",)


def test_a_truncated_tar_names_the_file_and_the_member_cut(written, tmp_path):
    shard = written[0] / "wds" / "shard-000001.tar"
    with tarfile.open(shard) as tar:
        image = next(member for member in tar.getmembers()[1:] if member.name.endswith(".jpg"))
        label = next(member for member in tar.getmembers()[1:] if member.name.endswith(".cls"))
    inside, after = tmp_path / "inside.tar", tmp_path / "after.tar"
    inside.write_bytes(shard.read_bytes()[:image.offset_data + image.size // 2])
    after.write_bytes(shard.read_bytes()[:label.offset_data + label.size])
    for cut, named in ((inside, f"member {image.name} ends at byte"), (after, f"it ends after member {label.name}")):
        with pytest.raises(DatasetError) as caught:
            WebDatasetShards(str(cut))
        line = str(caught.value)
        assert "\n" not in line and f"{cut}: truncated tar: {named}" in line


def test_a_key_with_no_image_names_the_shard_and_key_or_is_skipped(tmp_path, written):
    shard = tmp_path / "odd.tar"
    with tarfile.open(shard, "w") as tar:
        for name, data in (("a.jpg", written[3][0][0]), ("a.cls", b"1"), ("b.cls", b"2"), ("c.jpg", written[3][1][0])):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DatasetError, match=rf"{shard}: key b has no image \(no .jpg member\)"):
        WebDatasetShards(str(shard))
    kept = WebDatasetShards(str(shard), on_bad_sample="skip", label_ext=None)
    assert [index for index, _, _ in kept] == [0, 1] and kept.identity()["skipped"] == {"samples": 1}


def test_a_parquet_file_without_the_named_column_names_file_and_column(written):
    files = str(written[0] / "pq" / "*.parquet")
    with pytest.raises(DatasetError, match=r"part-00000.parquet: no column 'pixels' \(dataset.image_column"):
        parquet_dataset(files, image_column="pixels")
    with pytest.raises(DatasetError) as raised:
        parquet_dataset(files, label_column="target", on_bad_sample="skip")
    first = written[0] / "pq" / "part-00000.parquet"
    assert str(raised.value) == (f"parquet: no rows in {files!r} ({first}: no column 'target' (dataset.label_column; "
                                 "it has image, label))")


def test_no_shard_left_under_skip_is_one_line_naming_the_first_left_out(tmp_path):
    pattern = str(tmp_path / "shard-{000000..000001}.tar")
    with pytest.raises(DatasetError) as raised:
        WebDatasetShards(pattern, on_bad_sample="skip")
    assert str(raised.value) == f"webdataset: no samples in {pattern!r} ({tmp_path}/shard-000000.tar: no such shard)"


@pytest.mark.parametrize("build, line", [
    (lambda: MDSShards(""), "mds: input_dir must be a folder or a URL, got ''"),
    (lambda: MDSShards("x", label_key=""), "mds: label_key must be a column name, got ''"),
    (lambda: parquet_dataset("x", image_column=None), "parquet: image_column must be a column name, got None"),
    (lambda: LitDataChunks("x", index_key=3), "litdata: index_key must be a field name, got 3"),
])
def test_a_setting_that_names_no_folder_column_or_field_is_one_line_naming_it(build, line):
    """Checked before anything is read: none of these folders or files exist."""
    with pytest.raises(DatasetError) as raised:
        build()
    assert str(raised.value) == line


@pytest.mark.parametrize("args, named", [
    (["dataset=webdataset", 'dataset.urls="{root}/wds/shard-{{000000..000004}}.tar"'], "shard-000004.tar: no such shard"),
    (["dataset=parquet", 'dataset.files="{root}/pq/*.parquet"', "dataset.label_column=target"], "no column 'target'"),
    (["dataset=parquet", 'dataset.files="{root}/pq/*.parquet"', "dataset.on_bad_sample=maybe"], "on_bad_sample"),
])
def test_bad_input_exits_2_before_any_job_in_one_line(args, named, written, capsys, tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    assert_config_error_is_one_line([arg.format(root=written[0]) for arg in args], named, capsys, out)


def test_a_missing_library_names_the_formats_extra_in_one_pip_line(monkeypatch, written):
    monkeypatch.setattr(shard_split, "installed", lambda module: False)
    with pytest.raises(DatasetError) as caught:
        WebDatasetShards(str(written[0] / "wds" / PATTERN))
    assert str(caught.value).startswith("dataset=webdataset needs webdataset: pip install")
    assert "formats]" in str(caught.value)


def test_idle_readers_and_the_line_that_names_them():
    assert idle_readers(4, 1, 8) == [(0, 4), (0, 5), (0, 6), (0, 7)]
    line = idle_line("webdataset", 4, 1, 8)
    assert "4 shard(s) for 8 readers (8 workers): workers 4, 5, 6, 7 get no shard" in line
    assert line.endswith("or use workers=4")
    ranked = idle_line("webdataset", 4, 2, 3)
    assert "rank 0 workers 2; rank 1 workers 2" in ranked and ranked.endswith("workers=2")
    assert idle_line("webdataset", 1, 2, 0).endswith("ranks 1 get no shard and read nothing this epoch, so 1 carry "
                                                     "it; write more, smaller shards (`pipebench dataset convert "
                                                     "--shard-size N`, at least 2) or use distributed.nproc=1")
    assert idle_line("webdataset", 8, 2, 4) == ""
    offsets = ShardOffsets([4, 0, 3])
    assert [offsets.locate(i) for i in (0, 3, 4, 6)] == [(0, 0), (0, 3), (2, 0), (2, 2)]


def test_reads_in_pieces_count_bytes_sleep_the_emulated_storage_and_drop_pages_cold(tmp_path, monkeypatch):
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(3 << 20))
    slept, dropped = [], []
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: dropped.append((offset, length)))
    reads = FileReads(StorageSpec(cache="cold", latency_ms=5.0, mb_per_s=100.0), sleep=slept.append)
    with reads.open(str(path)) as f:
        assert f.read() == path.read_bytes()
    assert reads.counts()[1:4] == (3 << 20, 1, 3), "bytes, files, and a request a 1 MiB piece"
    assert slept[0] == pytest.approx(0.005) and sum(slept[1:]) == pytest.approx(3 / 100)
    assert dropped[0] == (0, 1 << 20), "each piece's pages dropped before it is read"


def test_the_warm_up_reads_the_local_shards(written):
    dataset = WebDatasetShards(str(written[0] / "wds" / PATTERN))
    plan = prepare_cache(dataset, StorageSpec())
    assert dataset.files() == sorted(written[1]) and plan.cache_mode == "warm"
    assert "page cache serves this run" in plan.note


@pytest.mark.slow
def test_the_whole_run_says_which_workers_get_no_shard_at_plan_time_and_in_the_report(whole_run):
    done, folder, _ = whole_run
    expected = idle_line("webdataset", SHARDS, 1, RUN_WORKERS)
    assert done.stderr.splitlines().count(f"warning: {expected}") == 1, "once, at plan time, not once a job"
    assert expected in (folder / "report.md").read_text()


@pytest.mark.slow
def test_the_whole_run_keeps_coverage_the_transform_table_and_the_read_figures(whole_run):
    _, folder, jobs = whole_run
    for job in jobs:
        assert job["coverage"]["exactly_once"] and job["coverage"]["length"] == IMAGES
        assert job["fingerprint"]["dataset"]["shards"] == SHARDS
        assert job["summary"]["read_bytes_per_sample"] > 0 and job["summary"]["cache_mode"] == "warm"
        steps = [row["transform"] for row in job["transforms"]]
        assert "decode" in steps and "PILToTensor" in steps, steps


def test_samples_of_a_shard_opened_before_the_window_still_give_read_figures():
    """A stream's samples read bytes from a shard opened earlier, so they count no file of their own."""
    io_rows = np.array([[1000, 4096, 0, 1, 0], [1000, 4096, 0, 1, 0]], dtype=np.int64)  # IO_FIELDS
    figures = file_read_figures(io_rows, np.array([2000, 2000]))
    assert figures["read_bytes_per_sample"] == 4096 and figures["io_share_of_load_pct"] == 50
    assert file_read_figures(np.zeros((2, len(IO_FIELDS)), dtype=np.int64), np.array([1, 1]))["read_bytes_per_sample"] is None


def test_litdata_chunks_give_the_same_images_and_every_index_once_across_workers(written):
    chunks = LitDataChunks(str(written[0] / "ld"), shuffle=True)
    assert len(chunks) == IMAGES and len(chunks.files()) == SHARDS
    read = sorted((index, image.fp.getvalue(), label) for index, image, label in chunks)
    assert [(data, label) for _, data, label in read] == written[3] and undecoded(read[0][1]) is False
    loader = DataLoader(chunks, batch_size=None, num_workers=3, collate_fn=lambda item: item[0])
    assert sorted(loader) == list(range(IMAGES))


def test_litdata_bad_input_names_the_chunk_or_the_field(written, tmp_path):
    folder = tmp_path / "ld"
    shutil.copytree(written[0] / "ld", folder)
    wrong_field = r"items have no image field 'pixels' \(dataset.image_key; .* fields: index \(int\), image \(bytes\)"
    with pytest.raises(DatasetError, match=wrong_field):
        LitDataChunks(str(folder), image_key="pixels")
    chunk = next(folder.glob("chunk-*.bin"))
    chunk.write_bytes(chunk.read_bytes()[:100])
    with pytest.raises(DatasetError, match=rf"{chunk}: truncated chunk: 100 bytes of"):
        LitDataChunks(str(folder))
    chunk.unlink()
    with pytest.raises(DatasetError, match=rf"{chunk}: no such chunk \(listed in index.json\)"):
        LitDataChunks(str(folder))
    with pytest.raises(DatasetError, match="no index.json"):
        LitDataChunks(str(tmp_path))
