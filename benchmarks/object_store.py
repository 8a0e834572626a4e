"""The S3 read path against local disk: the same shards read from a bucket and from their folder, side by side.

The synthetic corpus generator writes --images distinct JPEGs (533x800, quality 90, about 125 KB each, by
default) once into --work; pipebench's own converter (`pipebench.cli.dataset.convert`) writes them as
WebDataset tar shards and as Parquet files of --shard-size samples; moto's S3 server, started by this
script on the loopback in a process of its own, gets them in a bucket, and botocore is pointed at it
through the environment (AWS_ENDPOINT_URL and test credentials), as a user points it at MinIO or Ceph.
The server is stopped at the end, on an error or Ctrl-C too.

Every job is pipebench's own job measurement (`measure_job`) in this process: each format, on local disk
(warm: the page cache serves the shards) and through `s3://` URLs (fsspec/s3fs, ranged GETs over HTTP),
at each worker count, the configurations interleaved round after round (ABAB...) so drift on a shared
machine hits both storages alike. What it shows: what the object-store read path costs the same chain,
the loopback taking the network away, so the cost left is s3fs's and botocore's requests and the server's
(whose process shares this machine's cores with the job's).

It prints one table, a row a (format, storage, workers): samples/s (the median over rounds, with its
range), the load step's ms a sample (the read and the tar or row-group parsing), the read columns the job
reports (bytes, requests and read ms a sample), the time to the first batch, and on each s3 row its
samples/s over the local row's (the median of each round's pair). The same table, with the machine
named, goes to WORK/object_store.md and its figures to WORK/object_store.csv.

    python benchmarks/object_store.py                        # 500 images, shards of 100, workers 0,2, 3 rounds
    python benchmarks/object_store.py --quick                # a check that it works (well under a minute)
"""

import argparse
import csv
import datetime
import logging
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple
from unittest import mock

import s3fs
import torch

from pipebench.base.cores import usable_cores
from pipebench.base.errors import INTERRUPTED_EXIT_STATUS, USAGE_EXIT_STATUS, PipebenchError, error_line
from pipebench.base.tables import markdown_table
from pipebench.cli.dataset import convert
from pipebench.measure.fingerprint import cpu_model
from pipebench.measure.setup import quiet_torch_output

from storage_check import interleaved_rounds  # the benchmarks' one round-robin of jobs

BUCKET = "pipebench-object-store"
# Sized for a few minutes on a 2-core machine at the defaults: 5 shards, enough for 2 workers, and each
# job's window (pipebench's default 20 steps of 32) wraps the 500 images about once.
NUM_IMAGES, SHARD_SIZE = 500, 100
# The corpus's default size: each image a real ~125 KB JPEG, as a photo set's are.
IMAGE_WIDTH, IMAGE_HEIGHT = 533, 800
# --quick: few images, one round at workers 0 (flags given beside it win), tiny images and a batch small
# enough for 24 of them, so it checks that everything works in well under a minute.
QUICK_FLAGS = dict(images=24, shard_size=8, rounds=1, workers="0")
QUICK_IMAGE, QUICK_BATCH = 64, 4
# Parquet's streaming form: each row group read once, in order, as a tar shard is. Map-style under the
# default shuffle reads a whole row group for most samples (docs/formats.md, "Random access into
# Parquet"), which would measure that cost, not the object store's.
FORMATS: Mapping[str, Tuple[str, ...]] = {"webdataset": ("dataset=webdataset",),
                                          "parquet": ("dataset=parquet", "dataset.streaming=true")}
STORAGES = ("local", "s3 loopback")
# The chain's settings besides the transform, as benchmarks/storage_check.py has them: no consumer, no
# profiler or trace passes after the window, no progress bar between the printed lines.
CHAIN = ("consumer=none", "trace=none", "run.profile_steps=0", "run.progress=false")
# The environment botocore reads: the loopback endpoint and moto's accepted test credentials; a profile
# or an S3-only endpoint the user has set would win over them, so they are removed for the run.
TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}
OVERRIDING = ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE")
# How long the server's process may take to import moto and start listening, and to stop.
SERVER_START_S, SERVER_STOP_S = 60.0, 10.0
# The figures a job gives the table (medians over rounds) and the CSV (every round).
FIGURES = ("samples_per_s", "load_ms_per_sample", "read_bytes_per_sample", "read_requests_per_sample",
           "read_ms_per_sample", "first_batch_s")
COLUMNS = ("format", "storage", "workers", "samples_per_s", "samples_per_s_range", "load_ms_per_sample",
           "read_bytes_per_sample", "read_requests_per_sample", "read_ms_per_sample", "first_batch_s",
           "x_local")

Job = Tuple[str, str, int]  # (format, storage, workers)


def serve(port_out: Connection, stop: Connection) -> None:
    """moto's threaded S3 server on 127.0.0.1 (a free port, sent back), until `stop` says so.

    In a process of its own: in this one its request handling would take the GIL from the job's main
    loop at workers=0 and be counted as the chain's time."""
    from moto.server import ThreadedMotoServer

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the whole group: the parent stops it
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line a request, on the benchmark's stderr
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port_out.send(server.get_host_and_port()[1])
    try:
        stop.recv()
    finally:
        server.stop()


@contextmanager
def s3_server() -> Iterator[str]:
    """moto's server started on the loopback, and the environment pointing botocore at it; yields the
    endpoint. Stopped on leaving, however it is left."""
    context = multiprocessing.get_context("spawn")
    port_in, port_out = context.Pipe(duplex=False)
    stop_in, stop_out = context.Pipe(duplex=False)
    process = context.Process(target=serve, args=(port_out, stop_in), name="moto-s3", daemon=True)
    process.start()
    try:
        if not port_in.poll(SERVER_START_S):
            raise PipebenchError(f"moto's S3 server did not start within {SERVER_START_S:.0f} s "
                                 "(pip install 'moto[server]')")
        endpoint = f"http://127.0.0.1:{port_in.recv()}"
        with mock.patch.dict(os.environ, {"AWS_ENDPOINT_URL": endpoint, **TEST_CREDENTIALS}):
            for key in OVERRIDING:
                os.environ.pop(key, None)
            yield endpoint
    finally:
        s3fs.S3FileSystem.clear_instance_cache()  # no client of a stopped server is left for later use
        if process.is_alive():
            stop_out.send(None)
        process.join(SERVER_STOP_S)
        if process.is_alive():
            process.terminate()
            process.join()
        print(f"S3 server stopped (exit {process.exitcode})", flush=True)


def build(args: argparse.Namespace) -> Dict[str, Tuple[str, ...]]:
    """The corpus converted to each format under WORK/<format> (anew); the names of the files written, by format."""
    corpus = [f"dataset.num_images={args.images}", f"dataset.length={args.images}", f"dataset.width={args.width}",
              f"dataset.height={args.height}", f"dataset.cache_dir={args.work / 'jpegs'}"]
    sources = {}
    for name in FORMATS:
        out = args.work / name
        shutil.rmtree(out, ignore_errors=True)
        written = convert(name, out, args.shard_size, corpus)
        sources[name] = tuple(sorted(Path(path).name for path in written))
    return sources


def locations(name: str, root: str, files: Sequence[str]) -> Tuple[str, ...]:
    """The overrides reading format `name`'s `files` under `root` (a folder or an s3:// prefix)."""
    if name == "webdataset":
        first, last = (Path(file).stem.split("-")[-1] for file in (files[0], files[-1]))
        return (*FORMATS[name], f'dataset.urls="{root}/shard-{{{first}..{last}}}.tar"')
    return (*FORMATS[name], f'dataset.files="{root}/*.parquet"')


def upload(work: Path) -> None:
    """Each format's folder into the bucket, under its name."""
    fs = s3fs.S3FileSystem()
    fs.mkdir(BUCKET)
    for name in FORMATS:
        fs.put(f"{work / name}/", f"{BUCKET}/{name}/", recursive=True)


def _figures(run: Mapping[str, object]) -> Dict[str, float]:
    """A job's FIGURES from storage_check's reading of it; an empty cell is NaN."""
    return {key: float("nan") if run[key] is None else float(run[key]) for key in FIGURES}


def table_rows(results: Mapping[Job, List[Dict[str, float]]]) -> List[Dict[str, object]]:
    """A row a job: medians over rounds, the rate's range, and on s3 rows the median of each round's
    s3/local ratio of samples/s."""
    rows = []
    for (name, storage, workers), runs in results.items():
        row: Dict[str, object] = {"format": name, "storage": storage, "workers": workers}
        for key in FIGURES:
            row[key] = round(statistics.median(run[key] for run in runs), 3)
        rates = [run["samples_per_s"] for run in runs]
        row["samples_per_s"] = round(statistics.median(rates), 1)
        row["samples_per_s_range"] = f"{min(rates):.1f}–{max(rates):.1f}"
        row["read_bytes_per_sample"] = round(float(row["read_bytes_per_sample"]))
        local = results.get((name, STORAGES[0], workers))
        row["x_local"] = (round(statistics.median(s["samples_per_s"] / l["samples_per_s"]
                                                  for s, l in zip(runs, local)), 3)
                          if storage != STORAGES[0] and local else "")
        rows.append(row)
    return rows


def write(args: argparse.Namespace, results: Mapping[Job, List[Dict[str, float]]], table: str) -> None:
    """The table with the machine and settings named (WORK/object_store.md), every round's figures
    (WORK/object_store.csv)."""
    machine = f"{cpu_model()}, {usable_cores()} usable cores, {datetime.date.today().isoformat()}"
    settings = (f"{args.images} images of {args.width}x{args.height}, shards of {args.shard_size}, "
                f"transform={args.transform}, workers {args.workers}, {args.rounds} interleaved round(s); local "
                "shards warm (page cache), s3 through moto's server on 127.0.0.1")
    (args.work / "object_store.md").write_text(f"# Object storage against local disk\n\n{machine}; {settings}. "
                                               f"Medians over rounds; x_local: s3 samples/s over local's.\n\n{table}")
    with (args.work / "object_store.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=("format", "storage", "workers", "round", *FIGURES))
        writer.writeheader()
        for (name, storage, workers), runs in results.items():
            for round_, run in enumerate(runs):
                writer.writerow({"format": name, "storage": storage, "workers": workers, "round": round_ + 1, **run})


def measure(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    files = build(args)
    print(f"{args.images} images as {', '.join(FORMATS)} under {args.work} ({time.perf_counter() - started:.0f} s)",
          flush=True)
    with s3_server() as endpoint:
        upload(args.work)
        print(f"uploaded to s3://{BUCKET} at {endpoint}", flush=True)
        roots = {STORAGES[0]: lambda name: str(args.work / name), STORAGES[1]: lambda name: f"s3://{BUCKET}/{name}"}
        common = (*CHAIN, f"transform={args.transform}",
                  *((f"loader.batch_size={QUICK_BATCH}", "run=quick") if args.quick else ()))
        jobs = {(name, storage, w): (*common, *locations(name, roots[storage](name), files[name]), f"workers={w}")
                for w in args.worker_counts for name in FORMATS for storage in STORAGES}
        results = {job: [_figures(run) for run in runs] for job, runs in interleaved_rounds(jobs, args.rounds).items()}
    table = markdown_table(table_rows(results), COLUMNS, right=("samples_per_s_range", "x_local"))
    print(f"\n{table}")
    write(args, results, table)
    print(f"figures: {args.work / 'object_store.md'}, {args.work / 'object_store.csv'} "
          f"({time.perf_counter() - started:.0f} s)")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=NUM_IMAGES)
    parser.add_argument("--shard-size", type=int, default=SHARD_SIZE, help="samples a tar shard or Parquet file")
    parser.add_argument("--transform", default="imagenet")
    parser.add_argument("--workers", default="0,2", help="worker counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every configuration")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "pipebench-object-store",
                        help="images, shards and the table")
    parser.add_argument("--quick", action="store_true",
                        help="24 images of 64x64, shards of 8, 1 round, workers 0 (unless given): that it works")
    args = parser.parse_args(argv)
    args.width, args.height = IMAGE_WIDTH, IMAGE_HEIGHT
    if args.quick:
        parser.set_defaults(**QUICK_FLAGS)
        args = parser.parse_args(argv)
        args.width = args.height = QUICK_IMAGE
    args.worker_counts = [int(w) for w in args.workers.split(",")]
    quiet_torch_output()
    torch.set_num_threads(1)
    args.work.mkdir(parents=True, exist_ok=True)
    try:
        measure(args)
    except PipebenchError as exc:
        print(f"object_store: error: {error_line(exc)}", file=sys.stderr)
        return USAGE_EXIT_STATUS
    except KeyboardInterrupt:
        print("object_store: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_STATUS
    return 0


if __name__ == "__main__":
    sys.exit(main())
