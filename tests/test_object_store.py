"""Shards in an object store: `s3://` URLs read through fsspec/s3fs against an S3-compatible server this
module starts on the loopback (moto's) and stops at its end, with the endpoint and credentials taken from
the environment as botocore takes them. Remote reads get a local read's figures (bytes, requests, time)
and the slow-storage what-if; a URL that cannot be read is one line naming it, exit 2 before any job."""

import logging
import os
import re
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_config_error_is_one_line, compose_spec
from torch.utils.data import DataLoader
from torchvision.transforms import PILToTensor

from pipebench.base.errors import DatasetError
from pipebench.cli.dataset import convert
from pipebench.config.specs import StorageSpec
from pipebench.datasets.mds_shards import MDSShards
from pipebench.datasets.parquet_rows import parquet_dataset
from pipebench.datasets.webdataset_shards import WebDatasetShards
from pipebench.measure.steps import TimingSink
from pipebench.storage.page_cache import REMOTE, prepare_cache
from pipebench.measure.storage_io import file_read_columns
from pipebench.storage.file_reads import IO_FIELDS, FileReads
from pipebench.storage import object_store
from pipebench.storage.object_store import url_fs
from pipebench.pipeline.timed_iterable import InstrumentedIterable
from pipebench.pipeline.timed_chain import TimedCollate

moto_server = pytest.importorskip("moto.server", reason="the S3 tests need moto's server: pip install 'moto[server]'")
s3fs = pytest.importorskip("s3fs", reason="s3:// URLs need s3fs: pip install '.[s3]'")

BUCKET = "pipebench-shards"
IMAGES, SHARD_SIZE = 12, 4
TINY_CORPUS = [f"dataset.num_images={IMAGES}", f"dataset.length={IMAGES}", "dataset.width=32", "dataset.height=32",
               "dataset.num_classes=3"]
PATTERN = "shard-{000000..000002}.tar"
# MDSWriter's own uncompressed set (tests/test_mds.py reads it from disk): 3 shards.
MDS_SET = Path(__file__).parent / "fixtures" / "mds" / "plain"
# A blob larger than FileReads' 1 MiB pieces and smaller than s3fs's 50 MiB read-ahead block: three
# pieces read, one ranged GET sent.
BLOB_BYTES = 3 << 20


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """moto's S3 server on the loopback, the environment pointing botocore at it, and the tiny corpus
    converted to shards and Parquet files, on disk and uploaded to the bucket."""
    # The server (werkzeug) and botocore log through loggers that reach whatever handler an earlier
    # in-process run left on the root logger (Hydra's, on a capture stream pytest has since closed):
    # each record then prints a "Logging error" traceback into this module's stderr, which must hold
    # pipebench's line only. logging's own switch for handler errors silences them for the module.
    raising = logging.raiseExceptions
    logging.raiseExceptions = False
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    root = tmp_path_factory.mktemp("store")
    corpus = [*TINY_CORPUS, f"dataset.cache_dir={root / 'cache'}"]
    convert("webdataset", root / "wds", SHARD_SIZE, corpus)
    convert("parquet", root / "pq", 2 * SHARD_SIZE, corpus)
    (root / "blob.bin").write_bytes(os.urandom(BLOB_BYTES))
    with pytest.MonkeyPatch.context() as env:
        for key, value in (("AWS_ENDPOINT_URL", f"http://{host}:{port}"), ("AWS_ACCESS_KEY_ID", "testing"),
                           ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
            env.setenv(key, value)
        env.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        env.delenv("AWS_PROFILE", raising=False)
        s3fs.S3FileSystem.clear_instance_cache()
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        for folder in ("wds", "pq"):
            fs.put(str(root / folder) + "/", f"{BUCKET}/{folder}/", recursive=True)
        fs.put(str(root / "blob.bin"), f"{BUCKET}/blob.bin")
        fs.put(str(MDS_SET) + "/", f"{BUCKET}/mds/", recursive=True)
        yield root
        s3fs.S3FileSystem.clear_instance_cache()  # no later test may reuse a client of a stopped server
    server.stop()
    logging.raiseExceptions = raising


def _url(path: str) -> str:
    return f"s3://{BUCKET}/{path}"


def test_shards_and_parquet_files_in_a_bucket_read_as_they_do_on_disk(store):
    root = store
    local = sorted((i, image.fp.getvalue(), label) for i, image, label in WebDatasetShards(str(root / "wds" / PATTERN)))
    remote = WebDatasetShards(_url(f"wds/{PATTERN}"))
    assert remote.urls[0] == _url("wds/shard-000000.tar") and remote.files() == [], "no local file to warm"
    assert sorted((i, image.fp.getvalue(), label) for i, image, label in remote) == local
    rows = parquet_dataset(_url("pq/*.parquet"))
    assert [(rows[i][0].fp.getvalue(), rows[i][1]) for i in range(IMAGES)] == [(data, y) for _, data, y in local]


def test_a_remote_read_counts_its_bytes_requests_and_time_and_sleeps_the_what_if(store):
    slept = []
    reads = FileReads(StorageSpec(latency_ms=5.0, mb_per_s=100.0), sleep=slept.append)
    with reads.open(_url("blob.bin")) as f:
        assert f.read() == (store / "blob.bin").read_bytes()
    counts = dict(zip(IO_FIELDS, reads.counts()))
    assert (counts["read_bytes"], counts["read_files"]) == (BLOB_BYTES, 1)
    assert counts["read_requests"] == 1, "three 1 MiB pieces of one ranged GET (s3fs's read-ahead)"
    assert counts["read_ns"] > counts["open_ns"] > 0, "the open (its HEAD) and the GET both timed"
    assert slept[0] == pytest.approx(0.005) and sum(slept[1:]) == pytest.approx(3 / 100), "the what-if applies"


def test_forked_workers_read_the_bucket_and_send_back_what_they_read(store):
    dataset = WebDatasetShards(_url(f"wds/{PATTERN}"))
    loader = DataLoader(InstrumentedIterable(dataset, [PILToTensor()]), batch_size=2, num_workers=2,
                        collate_fn=TimedCollate([]))
    sink, indices = TimingSink(), []
    for batch in loader:
        sink.add(batch)
        indices += batch.indices.tolist()
    assert sorted(indices) == list(range(IMAGES))
    io_rows = np.concatenate(sink.sample_io)
    assert io_rows[:, IO_FIELDS.index("read_files")].sum() == len(dataset.urls), "each shard opened once"
    assert io_rows[:, IO_FIELDS.index("read_bytes")].sum() <= sum(dataset.sizes)
    columns = file_read_columns(sink, samples_per_s=10.0)
    assert columns["read_bytes_per_sample"] > 0 and columns["read_ms_per_sample"] > 0
    assert columns["read_requests_per_sample"] * IMAGES == len(dataset.urls), "one GET a shard"


def test_an_mds_set_the_bucket_refuses_is_access_denied_with_the_settings_not_a_damaged_index(store, monkeypatch):
    from moto import settings

    assert MDSShards(_url("mds")).shard_count() == 3, "read while the bucket lets anyone in"
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # credentials checked from now: 'testing' is none
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(DatasetError) as caught:
        MDSShards(_url("mds"))
    line = str(caught.value)
    assert line.startswith(f"mds: {_url('mds')}/index.json: access denied (") and "\n" not in line
    assert "not an MDS index" not in line and "AWS_ACCESS_KEY_ID" in line


@pytest.fixture
def endpoint(store, monkeypatch):
    """Sets a test's own endpoint variables, undone after it, with s3fs's cached clients dropped each
    time (a client keeps the endpoint it was built with)."""
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)  # s3fs's own retries, beside botocore's
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's would take ~13 s to give up on a closed port

    def point(**variables: str) -> None:
        for key, value in variables.items():
            monkeypatch.setenv(key, value)
        s3fs.S3FileSystem.clear_instance_cache()

    yield point
    monkeypatch.undo()
    s3fs.S3FileSystem.clear_instance_cache()


def test_the_endpoint_comes_from_aws_endpoint_url_s3_before_aws_endpoint_url(endpoint):
    endpoint(AWS_ENDPOINT_URL_S3=os.environ["AWS_ENDPOINT_URL"], AWS_ENDPOINT_URL=f"http://127.0.0.1:{_closed_port()}")
    assert len(WebDatasetShards(_url(f"wds/{PATTERN}"))) == IMAGES


def _closed_port() -> int:
    """A loopback port nothing listens on: bound, then let go."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_url_that_cannot_be_read_is_one_line_naming_it_exit_2_before_any_job(endpoint, capsys, tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    assert_config_error_is_one_line(["dataset=webdataset", f'dataset.urls="{_url("wds/shard-{000000..000003}.tar")}"'],
                                    f"{_url('wds/shard-000003.tar')}: no such shard", capsys, out)
    with pytest.raises(DatasetError, match="^nosuch://bucket/shard.tar: not a path or a URL fsspec opens"):
        WebDatasetShards("nosuch://bucket/shard.tar")
    endpoint(AWS_ENDPOINT_URL=f"http://127.0.0.1:{_closed_port()}")
    files = _url("pq/*.parquet")
    with pytest.raises(DatasetError, match=rf"^{re.escape(files)}: cannot read it \(EndpointConnectionError: "):
        parquet_dataset(files)
    assert_config_error_is_one_line(["dataset=webdataset", f'dataset.urls="{_url(f"wds/{PATTERN}")}"'],
                                    f"{_url('wds/shard-000000.tar')}: cannot read it (EndpointConnectionError: Could "
                                    "not connect to the endpoint URL", capsys, out)


def test_a_failed_read_is_the_unreadable_line_for_a_url_and_the_error_itself_for_a_local_path():
    """The one rule every reader's last except clause hands its error to (object_store.read_failure)."""
    local = PermissionError("denied")
    assert object_store.read_failure("/data/shard.tar", local) is local
    remote = object_store.read_failure("s3://bucket/shard.tar", RuntimeError("AccessDenied"), "s3://bucket/index.json")
    assert isinstance(remote, DatasetError)
    assert str(remote).startswith("s3://bucket/index.json: cannot read it (RuntimeError: AccessDenied); the endpoint")


# The black hole's bounds, tiny so the test takes about a second: two attempts of 0.3 s each.
HOLE_TIMEOUT_S, HOLE_ATTEMPTS = 0.3, 2
# What the test allows before calling it a hang: the defaults took over 400 s.
HOLE_LIMIT_S = 30


def test_a_store_that_accepts_and_never_answers_ends_in_one_line_naming_the_attempts_and_time(monkeypatch):
    """A listening socket that nobody accepts from: the kernel completes the connection and the request
    waits for an answer that never comes."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        for key, value in (("AWS_ENDPOINT_URL", f"http://127.0.0.1:{hole.getsockname()[1]}"),
                           ("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                           ("AWS_DEFAULT_REGION", "us-east-1")):
            monkeypatch.setenv(key, value)
        for key in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", object_store.ATTEMPTS_VARIABLE):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setattr(object_store, "STORE_READ_TIMEOUT_S", HOLE_TIMEOUT_S)
        monkeypatch.setattr(object_store, "STORE_CONNECT_TIMEOUT_S", HOLE_TIMEOUT_S)
        monkeypatch.setattr(object_store, "STORE_ATTEMPTS", HOLE_ATTEMPTS)
        s3fs.S3FileSystem.clear_instance_cache()
        files = _url("pq/*.parquet")
        start = time.monotonic()
        try:
            with pytest.raises(DatasetError) as refused:
                parquet_dataset(files)
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
    assert time.monotonic() - start < HOLE_LIMIT_S, "bounded, not the defaults' 400 s"
    line = str(refused.value)
    assert line.startswith(f"{files}: the store gave no answer: 2 attempt(s) of a 0.3 s read timeout, about 0.6 s "), line
    assert "ReadTimeoutError" in line and "\n" not in line


def test_a_missing_s3fs_names_the_s3_extra_in_one_pip_line(store, monkeypatch, capsys, tmp_path):
    import fsspec

    def no_s3fs(url, **kwargs):
        raise ImportError("Install s3fs to access S3")

    monkeypatch.setattr(fsspec.core, "url_to_fs", no_s3fs)
    # The sweep's builds then run in this process, where s3fs is patched away, not in a child of a
    # job process started ahead (pipebench.sweep.build_check).
    monkeypatch.setattr("pipebench.cli.main.job_ahead", lambda words: None)
    url = _url("wds/shard-000000.tar")
    with pytest.raises(DatasetError, match=rf"^{url}: an s3:// URL needs s3fs: pip install .*\[s3\]"):
        url_fs(url)
    out = tmp_path / "results"
    out.mkdir()
    assert_config_error_is_one_line(["dataset=webdataset", f'dataset.urls="{url}"'], "needs s3fs", capsys, out)


def test_a_dataset_in_a_bucket_runs_remote_with_the_what_if_and_every_read_figure(store, tmp_path):
    """The whole job in this process: cache_mode says no page cache serves it, the emulated latency is
    slept once a shard opened and counted as read time, and the read columns are filled."""
    from pipebench.measure.job import measure_job

    dataset = WebDatasetShards(_url(f"wds/{PATTERN}"))
    plan = prepare_cache(dataset, StorageSpec(cache="cold"))
    assert plan.cache_mode == REMOTE and "does nothing for a URL" in plan.note
    spec = compose_spec(["dataset=webdataset", f'dataset.urls="{_url(f"wds/{PATTERN}")}"', "dataset.storage.latency_ms=50",
                         "run=quick", "run.profile_steps=0", "run.progress=false", "run.warmup_steps=0",
                         "run.min_time_s=0", "loader.batch_size=2", "consumer=none", "trace=none",
                         "transform.per_sample=[{_target_:torchvision.transforms.PILToTensor}]", "transform.per_batch=[]"])
    summary = measure_job(spec, tmp_path).summary.row
    assert summary["cache_mode"] == REMOTE and summary["storage_latency_ms"] == 50
    assert summary["read_bytes_per_sample"] > 0 and summary["read_requests_per_sample"] > 0
    assert summary["read_files_per_sample"] > 0, "the window opened a shard"
    assert summary["read_ms_per_sample"] >= 50 * summary["read_files_per_sample"], "the latency is read time"
    assert summary["first_batch_open_s"] >= 0.05, "the first batch opened a shard, its latency slept"
    assert summary["first_batch_fill_s"] > 0 and summary["first_batch_decode_s"] > 0
