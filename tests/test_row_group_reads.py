"""Random access into Parquet row groups: the line that says what a shuffled map-style read costs, at plan
time and in the diagnosis's what-to-do list, and the bytes a row-group read is counted for."""

import io
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from pipebench.datasets.parquet_rows import parquet_dataset, write_parquet
from pipebench.model.shards import random_access_line
from pipebench.storage.file_reads import READ_BYTES
from pipebench.pipeline.sweep_check import plan_lines
from pipebench.report.diagnosis import diagnose, render_diagnosis
from stored_results import transform_row

# The finding's set: 2,000 images of ~130 KB in 24 row groups (8 files of 250 rows, row groups of 100).
IDENTITY = {"name": "parquet", "row_groups": 24, "num_samples": 2000, "file_bytes": 260_000_000, "streaming": False}


def test_the_line_fires_for_a_shuffled_map_style_read_of_multi_row_groups_only():
    line = random_access_line(IDENTITY, shuffle=True)
    assert ("parquet: shuffled random access reads whole row groups: 2000 samples in 24 row groups of 83 rows on "
            "average, and a reader keeps its last 2, so about 92% of samples (loader.shuffle=true) land in one not "
            "kept and read it whole, 83 rows read for one (about 10.8 MB)") in line
    assert "dataset.streaming=true" in line and "--shard-size N" in line and "loader.shuffle=false" in line
    measured = random_access_line(IDENTITY, shuffle=True, read_bytes_per_sample=10_000_000)
    assert "measured: 10.0 MB read a sample against 130 KB a row (77x)" in measured
    assert random_access_line({**IDENTITY, "streaming": True}, shuffle=True) == "", "streaming reads each once"
    assert random_access_line(IDENTITY, shuffle=False) == "", "in order, each row group is read once"
    assert random_access_line({**IDENTITY, "row_groups": 2000}, shuffle=True) == "", "one-row groups read one row"
    assert random_access_line({**IDENTITY, "row_groups": 2}, shuffle=True) == "", "every row group is kept"
    assert random_access_line({"name": "image_folder", "num_samples": 2000}, shuffle=True) == ""


def _result(job, workers, shuffle, read_bytes):
    return {
        "job": job, "job_num": int(job.split("-")[1]),
        "config": {"loader": {"shuffle": shuffle}},
        "overrides": ["dataset=parquet", f"workers={workers}"],
        "summary": {"job": job, "transform": "t", "workers": workers, "batch_size": 1, "samples_per_s": 43.0,
                    "samples_per_s_ci_low": 40.0, "samples_per_s_ci_high": 46.0, "starvation_pct": 0.0,
                    "pipeline_ms_per_sample": 23.0, "cpu_ms_per_sample": 20.0, "transfer_ms_median": 1.0,
                    "ready_next_ms_median": 0.2, "read_bytes_per_sample": read_bytes},
        "transforms": [transform_row("load ParquetRows", 15.4, 70.0, "load"),
                       transform_row("decode", 6.6, 30.0, "decode")],
        "passes": [{"samples": [1] * 4, "step_ms": [23.0] * 4, "wait_ms": [22.0] * 4, "compute_ms": [0.0] * 4,
                    "h2d_ms": [0.0] * 4}],
        "consumer_report": {"kind": "none", "device": None},
        "fingerprint": {"usable_cores": 2, "dataset": IDENTITY},
        "pin_memory_effective": False,
    }


def test_the_diagnosis_says_it_once_a_dataset_with_the_bytes_its_jobs_read():
    text = render_diagnosis(diagnose([_result("job-0", 0, True, 10_000_000), _result("job-1", 2, True, None)]))
    assert text.count("shuffled random access reads whole row groups") == 1
    assert "measured: 10.0 MB read a sample against 130 KB a row (77x)" in text
    unshuffled = render_diagnosis(diagnose([_result("job-0", 0, False, 130_000)]))
    assert "row groups" not in unshuffled


# Twelve JPEGs in files of 4 rows: three row groups of 4 rows, one more than a reader keeps.
IMAGES, ROWS_A_FILE = 12, 4
# Noise images this wide are ~20 KB as JPEGs, so a row group is larger than the 64 KB pyarrow's footer read
# takes from a file's end, which would otherwise count the row group's bytes by itself.
NOISE_SIDE = 128


def _noise_jpeg(seed):
    image = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (NOISE_SIDE, NOISE_SIDE, 3), dtype=np.uint8)).save(
        image, "JPEG", quality=95)
    return image.getvalue()


@pytest.fixture()
def parquet_files(tmp_path):
    """The pattern of the files written, and the smallest image's bytes. Each image differs: Parquet's
    dictionary encoding would store one copy of a repeated one."""
    images = [_noise_jpeg(i) for i in range(IMAGES)]
    write_parquet(((f"{i}.jpg", image, i % 3) for i, image in enumerate(images)), tmp_path, shard_size=ROWS_A_FILE)
    return str(tmp_path / "*.parquet"), min(len(image) for image in images)


def test_plan_time_names_a_shuffled_map_style_read_and_leaves_streaming_and_order_alone(parquet_files):
    rows, stream = parquet_dataset(parquet_files[0]), parquet_dataset(parquet_files[0], streaming=True)

    def job(shuffle):
        return SimpleNamespace(loader=SimpleNamespace(shuffle=shuffle), dataset_name="parquet",
                               distributed=SimpleNamespace(nproc=1), workers=1)

    (line,), _ = plan_lines([job(True)], [rows])
    assert line.startswith("parquet: shuffled random access reads whole row groups: 12 samples in 3 row groups "
                           "of 4 rows on average") and "4 rows read for one (about" in line
    assert plan_lines([job(False)], [rows])[0] == [], "in order, each row group is read once"
    assert plan_lines([job(True)], [stream])[0] == [], "a stream reads each row group once"


def test_a_row_group_read_counts_its_bytes_for_the_sample_that_read_it(parquet_files):
    """pyarrow's pre-buffering read in its own threads, where the sample's count saw none of it."""
    pattern, image_bytes = parquet_files
    rows = parquet_dataset(pattern)
    before = rows.reads.counts()
    rows[5]
    assert rows.reads.since(before)[READ_BYTES] >= ROWS_A_FILE * image_bytes, "the row group's images were counted"
    assert rows.identity()["file_bytes"] >= IMAGES * image_bytes
