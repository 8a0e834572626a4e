"""GPU-side truth inside real jobs: empty columns and a note without CUDA, real figures with it."""

import csv
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import FAST_JOB, NO_CHAIN, QUICK_RUN, TINY_DATASET, results_folder, run_cli
from cuda_marks import NEEDS_CUDA

from pipebench.config.specs import ConsumerSpec
from pipebench.measure.gpu.session import (
    GPU_TRACE_FILE,
    GpuSession,
    LabelledConsumer,
    trace_steps,
    trace_window_note,
)
from pipebench.measure.gpu.sync_detect import CONSUMER_LABEL
from pipebench.measure.gpu.trace import CPU_OP_CATEGORY, load_trace, windows
from pipebench.pipeline.consumers import build_consumer
from pipebench.record.results import SUMMARY_COLUMNS

# It asserts on measured rates, CPU time or the host's load: under xdist it runs with no other test beside it.
pytestmark = pytest.mark.alone

NO_CUDA_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
GPU_COLUMNS = ["h2d_gpu_ms_median", "gpu_util_pct", "syncs_per_step", "sync_ops", "sync_wait_ms_per_step",
               "gpu_busy_pct", "trace_accel_util_pct", "idle_host_wait_pct", "idle_kernel_wait_pct", "idle_other_pct",
               "reserved_mb_peak", "alloc_retries", "device_frees", "reserved_oscillating"]


# FAST_JOB's settings past the dataset, the quick run and its consumer: the masked-loss pair names its own.
SHORT_JOB = [arg for arg in FAST_JOB if arg not in (*TINY_DATASET, *QUICK_RUN, "consumer=none")]


def summary_csv(folder: Path):
    with open(folder / "summary.csv") as f:
        return {row["consumer"] + ("+pinned" if row["pin_memory"] == "True" else ""): row for row in csv.DictReader(f)}


def result_json(folder: Path, consumer: str):
    for path in sorted(folder.glob("job-*/result.json")):
        data = json.loads(path.read_text())
        if data["summary"]["consumer"] == consumer:
            return path.parent, data
    raise AssertionError(f"no {consumer} job under {folder}")


def test_gpu_columns_are_appended_to_the_summary():
    # Appended after the original columns (the multi-rank columns came after them in the merge).
    start = SUMMARY_COLUMNS.index("epochs") + 1
    tail = SUMMARY_COLUMNS[start:start + len(GPU_COLUMNS) + 3]
    assert tail[:2] == ["pin_memory", "consumer_ms_median"] and tail[-1] == "gpu_notes"
    assert tail[2:-1] == GPU_COLUMNS


def test_a_cpu_consumer_leaves_every_gpu_column_empty_with_a_note():
    consumer = build_consumer(ConsumerSpec("toy_cnn", 0.0, "fixed", 0.0, 0.01, 0.9, "cpu"), 0)
    gpu = GpuSession(consumer)
    gpu.mark("first_measured")
    gpu.mark("last_measured")
    columns = gpu.columns()
    assert all(columns[c] is None for c in GPU_COLUMNS)
    assert columns["gpu_notes"] == ("consumer not on CUDA" if torch.cuda.is_available() else "not measured: no CUDA")
    assert gpu.record()["on_cuda"] is False


def test_real_torch_traces_carry_the_fields_the_analyses_read(tmp_path):
    """A CPU profile of the labelled sync consumer: the same ph/cat/name/ts/dur/tid a CUDA trace
    has on the host side, so the windows and operators the sync detector walks are really there."""
    consumer = LabelledConsumer(build_consumer(ConsumerSpec("masked_loss_sync", 0.0, "fixed", 0.0, 0.01, 0.9,
                                                            "cpu"), 0))
    data = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8)
    labels = torch.arange(8) % 10
    consumer.step(data, labels)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            consumer.step(data, labels)
    path = tmp_path / "cpu_trace.json"
    prof.export_chrome_trace(str(path))
    parsed = load_trace(path)
    steps = windows(parsed, CONSUMER_LABEL)
    assert len(steps) == 2 and consumer.last_batch[1] is labels
    ops = {e.name for e in parsed if e.cat == CPU_OP_CATEGORY and any(w.contains(e) for w in steps)}
    assert {"aten::nonzero", "aten::_unique2", "aten::index"} <= ops, sorted(ops)


@pytest.mark.beside
@pytest.mark.slow
@NO_CUDA_ONLY
def test_masked_loss_pair_on_the_cpu_reports_the_ratio_and_no_sync_count(tmp_path):
    # Short jobs (no warm-up, profile pass or minimum time): it reads columns, notes and the ratio the
    # report prints, not a rate.
    proc = run_cli(["run", *TINY_DATASET, *NO_CHAIN, *QUICK_RUN, *SHORT_JOB,
                    "consumer=masked_loss_sync,masked_loss_fixed"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / results_folder(proc.stdout)
    rows = summary_csv(folder)
    for kind in ("masked_loss_sync", "masked_loss_fixed"):
        row = rows[kind]
        assert all(row[c] == "" for c in GPU_COLUMNS), {c: row[c] for c in GPU_COLUMNS}
        assert row["gpu_notes"] == "not measured: no CUDA" and row["pin_memory"] == "False"
        assert float(row["consumer_ms_median"]) > 0
        job_dir, result = result_json(folder, kind)
        assert result["gpu"]["note"] == "not measured: no CUDA" and result["gpu"]["syncs_trace"] is None
        assert not (job_dir / GPU_TRACE_FILE).exists()
    markdown = (folder / "summary.md").read_text()
    assert "## masked loss" in markdown and "not measured: no CUDA" in markdown
    ratio = float(rows["masked_loss_sync"]["consumer_ms_median"]) / float(rows["masked_loss_fixed"]["consumer_ms_median"])
    assert f"{ratio:.4g}" in markdown
    assert "## masked loss" in proc.stdout  # the report's GPU section, printed at the end of the run


def _cuda_run(tmp_path: Path, *overrides: str) -> Path:
    proc = run_cli(["run", *TINY_DATASET, *NO_CHAIN, *QUICK_RUN, "workers=2", *overrides], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / results_folder(proc.stdout)


@NEEDS_CUDA
def test_on_cuda_the_jobs_report_gpu_timings_syncs_idle_and_allocator(tmp_path):
    # Four jobs, not the six of a consumer x pin_memory sweep: only the toy CNN is read unpinned.
    # run.sync=per_step: the synchronised loop times each phase (and the copy) on its own.
    pinned = _cuda_run(tmp_path, "consumer=masked_loss_sync,masked_loss_fixed,toy_cnn", "loader.pin_memory=true",
                       "run.sync=per_step")
    pageable = _cuda_run(tmp_path, "consumer=toy_cnn", "loader.pin_memory=false", "run.sync=per_step")
    rows = {**summary_csv(pinned), **summary_csv(pageable)}
    sync, fixed = rows["masked_loss_sync+pinned"], rows["masked_loss_fixed+pinned"]
    assert float(sync["syncs_per_step"]) >= 3 and float(fixed["syncs_per_step"]) == 0
    assert "nonzero" in sync["sync_ops"] and "unique" in sync["sync_ops"] and fixed["sync_ops"] == ""
    assert float(sync["sync_wait_ms_per_step"]) > 0
    for key in ("toy_cnn", "toy_cnn+pinned", "masked_loss_sync+pinned"):
        row = rows[key]
        assert 0 < float(row["gpu_busy_pct"]) <= 100
        shares = [float(row[c] or 0) for c in ("idle_host_wait_pct", "idle_kernel_wait_pct", "idle_other_pct")]
        assert sum(shares) == pytest.approx(100, abs=0.01)
        assert 0 < float(row["h2d_gpu_ms_median"]) <= float(row["h2d_ms_median"]) * 1.05 + 0.05
        assert float(row["reserved_mb_peak"]) > 0 and int(row["alloc_retries"]) == 0
        if importlib.util.find_spec("pynvml") is not None:
            assert 0 <= float(row["gpu_util_pct"]) <= 100
        else:
            assert "NVML" in row["gpu_notes"]
    job_dir, result = result_json(pinned, "toy_cnn")
    assert (job_dir / GPU_TRACE_FILE).exists()
    live = {kind: result_json(pinned, kind)[1]["gpu"]["syncs_live"] for kind in ("masked_loss_sync", "masked_loss_fixed")}
    assert live["masked_loss_sync"]["per_step"] >= 3 and live["masked_loss_fixed"]["syncs"] == 0
    phases = result["consumer_report"]["phases_ms"]
    assert result["consumer_report"]["timer"] == "cuda_event"
    assert all(phases[p]["median"] > 0 for p in ("forward", "backward", "optimizer"))
    # CUDA-event phases run on the GPU after the host recorded the first event and before its wait
    # for the last returned, so over the same steps they sum to at most the host-timed region.
    # Not the job's compute_ms: that covers the measured steps only, while the phases also cover
    # warm-up and the CUPTI-profiled steps after them, which run slower (on the H100 that read
    # 3.15 ms of phases against a 2.99 ms measured mean).
    timed = result["consumer_report"]["timed_ms"]
    assert all(phases[p]["n"] == timed["n"] for p in phases)
    assert sum(phases[p]["mean"] for p in phases) <= timed["mean"]
    assert "## GPU" in (pinned / "summary.md").read_text()


@NEEDS_CUDA
def test_on_cuda_the_toy_cnn_runs_ahead_by_default_and_reads_the_gpus_own_timeline(tmp_path):
    folder = _cuda_run(tmp_path, "consumer=toy_cnn", "loader.pin_memory=true")
    (row,) = summary_csv(folder).values()
    assert row["step_sync"] == "async"
    shares = [float(row[c]) for c in ("starvation_pct", "starvation_other_pct", "accel_util_pct")]
    assert all(0 <= s <= 100 for s in shares) and sum(shares) == pytest.approx(100, abs=0.01)
    assert float(row["h2d_gpu_ms_median"]) > 0  # the copies' GPU time, read late from their events
    _, result = result_json(folder, "toy_cnn")
    assert result["consumer_report"]["timer"].startswith("none")  # no phase timer: nothing waits
    steps = [s for p in result["passes"] for s in p["gpu_busy_ms"]]
    assert steps and all(s > 0 for s in steps)


def test_the_gpu_trace_spans_whole_worker_cycles_and_says_when_it_is_not_the_window():
    """Five steps at 8 workers fell inside one burst of ready batches on an H100 (89.6% busy
    against 23-25% for the job): the trace now spans whole cycles, and a gap is flagged."""
    assert [trace_steps(c) for c in (1, 3, 8, 16)] == [5, 6, 16, 32]
    assert "89.6" not in (trace_window_note(24.0, 89.6) or "") and "90%" in trace_window_note(24.0, 89.6)
    assert trace_window_note(24.0, 30.0) is None and trace_window_note(None, 50.0) is None
