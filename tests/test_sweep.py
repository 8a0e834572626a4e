"""End to end through the real CLI: a sweep gives one row per job, files parse, faults stay contained."""

import csv
import json
from pathlib import Path

import pytest
from conftest import FAST_JOB, NO_PROFILE, QUICK_RUN, TINY_DATASET, results_folder, run_cli
from PIL import Image

SUMMARY_REQUIRED = ["job", "dataset", "transform", "workers", "batch_size", "samples_per_s", "step_ms_mean",
                    "step_ms_var", "step_ms_median", "first_batch_s"]
TRANSFORMS_REQUIRED = ["job", "stage", "transform", "calls", "ms_per_call_mean", "ms_per_call_median", "share_pct"]
# The shortest jobs with the profiler pass kept: the user chain's test reads job-0's trace and profile.
PROFILED_FAST_JOB = [word for word in FAST_JOB if word not in NO_PROFILE]
# The shortest jobs on a dataset of the test's own (an image folder).
FAST_JOB_OWN_DATASET = [word for word in FAST_JOB if word not in TINY_DATASET]
# Steps of the bad-images test's skip job: 24 samples are more than the folder's 14 good images, so
# its first epoch, and both bad images in it, are read whatever the order.
SKIP_JOB_STEPS = 3


def _csv(path: Path):
    with path.open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_user_chain_sweep_writes_one_row_per_job(user_project):
    proc = run_cli(["run", "--config-dir", "my_conf", "transform=tiny", "workers=0,1", *PROFILED_FAST_JOB,
                    "results_dir=out"], cwd=user_project)
    assert proc.returncode == 0, proc.stderr
    folder = user_project / results_folder(proc.stdout)
    assert folder.parent == user_project / "out" and "-transform-tiny_workers-0+1" in folder.name

    summary = _csv(folder / "summary.csv")
    assert [r["workers"] for r in summary] == ["0", "1"]
    assert set(SUMMARY_REQUIRED) <= set(summary[0])
    assert all(float(r["samples_per_s"]) > 0 and r["transform"] == "tiny" for r in summary)

    rows = _csv(folder / "transforms.csv")
    assert set(TRANSFORMS_REQUIRED) <= set(rows[0])
    for job in (r["job"] for r in summary):
        stages = {(r["stage"], r["transform"]) for r in rows if r["job"] == job}
        assert {("load", "RandomTensorDataset"), ("per_sample", "AddOne"), ("per_sample", "BusyWait"),
                ("collate", "default_collate"), ("per_batch", "BatchScale")} == stages
        assert abs(sum(float(r["share_pct"]) for r in rows if r["job"] == job) - 100) < 1e-6

    assert (folder / "comparison.md").read_text().strip() in proc.stdout
    results = [json.loads(p.read_text()) for p in sorted(folder.glob("job-*/result.json"))]
    assert len(results) == 2
    for result in results:
        assert result["config"]["workers"] == result["summary"]["workers"]
        assert {"torch", "torchvision", "python", "pipebench", "cpu_model", "usable_cores", "gpu",
                "start_method", "dataset", "git_commit"} <= set(result["fingerprint"])
        assert "environ" not in json.dumps(result["fingerprint"]).lower()
        assert len(result["passes"][0]["step_ms"]) == result["summary"]["steps"]
    assert results[1]["fingerprint"]["start_method"] in ("fork", "spawn", "forkserver")
    trace = json.loads((folder / "job-0" / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"per_sample/BusyWait", "collate/default_collate", "per_batch/BatchScale"} <= names
    assert "BusyWait" in (folder / "job-0" / "profile.txt").read_text()
    assert not (folder / "job-1" / "trace.json").exists(), "workers' labels never reach a profiler"


def _small_images(folder: Path, count: int = 8) -> Path:
    folder.mkdir()
    for i in range(count):
        Image.new("RGB", (120, 100), (40 * i, 90, 200)).save(folder / f"img{i}.jpg")
    return folder


@pytest.mark.slow
def test_image_smaller_than_crop_names_the_file(tmp_path):
    images = _small_images(tmp_path / "small")
    proc = run_cli(["run", "dataset=image_folder", f"dataset.path={images}", "loader.shuffle=false",
                    *QUICK_RUN, "results_dir=out"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("pipebench: error:")]
    assert len(error) == 1 and "img0.jpg" in error[0] and "crop size" in error[0]


@pytest.mark.slow
def test_skip_counts_bad_images_and_a_failing_job_keeps_earlier_rows(tmp_path):
    images = tmp_path / "mixed"
    images.mkdir()
    for i in range(14):
        Image.new("RGB", (300, 300), (10 * i, 90, 200)).save(images / f"ok{i:02d}.jpg")
    (images / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    whole = (images / "ok00.jpg").read_bytes()
    (images / "truncated.jpg").write_bytes(whole[: len(whole) // 3])
    proc = run_cli(["run", "dataset=image_folder", f"dataset.path={images}", "transform=yuv_mask_fast",
                    "run.on_error=skip,fail", *FAST_JOB_OWN_DATASET, f"run.steps={SKIP_JOB_STEPS}",
                    "results_dir=out"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("pipebench: error:")]
    assert len(error) == 1 and (".jpg" in error[0])
    rows = _csv(tmp_path / results_folder(proc.stdout) / "summary.csv")
    assert len(rows) == 1, "the skip job's row survives the fail job"
    assert "on_error=skip" in rows[0]["job"] and int(rows[0]["skipped_samples"]) >= 2


@pytest.mark.slow
def test_runs_from_a_source_checkout_with_spawned_workers(tmp_path):
    """From the repo root, `pipebench` in the cwd must not hide the catalogues, even under spawn."""
    images = tmp_path / "photos"
    images.mkdir()
    for i in range(8):
        Image.new("RGB", (300, 280), (30 * i, 120, 60)).save(images / f"p{i}.jpg")
    repo_root = Path(__file__).resolve().parents[1]
    proc = run_cli(["run", "dataset=image_folder", f"dataset.path={images}", "transform=yuv_mask_batched",
                    "workers=1", "loader.multiprocessing_context=spawn", "loader.persistent_workers=true", *QUICK_RUN, f"results_dir={tmp_path / 'out'}"],
                   cwd=repo_root)
    assert proc.returncode == 0, proc.stderr
    row = _csv(results_folder(proc.stdout) / "summary.csv")[0]
    assert row["transform"] == "yuv_mask_batched" and float(row["samples_per_s"]) > 0
