"""On a GPU machine, in one step: the GPU benchmarks, trace fixtures recorded, then the GPU tests.

    python benchmarks/gpu_check.py                    # parts 1-5
    python benchmarks/gpu_check.py --parts overhead   # part 6 alone, in a call of its own
    python benchmarks/gpu_check.py --parts storage    # part 7 alone, in a call of its own
    python benchmarks/gpu_check.py --quick            # part 2 at run=quick, then part 5 without its
                                                      # 4-job end-to-end test: under 2 minutes
    python benchmarks/gpu_check.py --parts tests,backends   # some parts, in the order named
    python benchmarks/gpu_check.py --update-fixtures  # also copy the recordings into tests/fixtures/gpu/recorded/

Every part writes its files into the output folder (--out, else $OUT, else results/gpu_check/) as
soon as it ends, so a run cut short keeps every part it finished:

1. seed: the seed chain feeding the toy CNN at workers 0 and 8: real starvation on a GPU.
2. gpu: the fast chain at workers=4, pinned, into masked_loss_sync, masked_loss_fixed and toy_cnn:
   syncs per step, the pair's step-time ratio, GPU busy % and idle breakdown. Their three
   gpu_trace.json, trimmed to the events and fields the analyses read, go to fixtures/ with
   expected.json (what the jobs reported); tests/test_gpu_trace.py checks the analyses against such
   a recording on any machine.
3. pageable: part 2's toy CNN with pin_memory=false; pinning/ merges it with part 2 (`pipebench
   report`): pinned against pageable host-to-device copies.
4. backends: the fast chain at workers=8 into the toy CNN, on each loader backend (dataloader,
   threads, spdl): processes against threads on a many-core host feeding a real GPU.
5. tests: the GPU test files and the CUDA tests of other files, which no longer skip (tests.txt).
6. overhead: the harness against a plain loop of each backend at workers=8 (backend_overhead.py,
   no consumer: it needs the many cores, not the GPU), into overhead.txt.
7. storage: `pipebench storage-check` of the resnet50 preset on h100 with the toy CNN on the GPU in
   place of the emulated step, beside the same check with the sleep (storage-emulated.txt,
   storage-toy_cnn.txt, and storage/ with each check's verdict.json and report.md): the accelerators
   each sustains, their AU, and what held one more back. Both read ImageNet's chain cropped to 256
   (the toy CNN takes a power-of-two side; without a chain the preset hands raw bytes). Shortened to
   fit one device call (1 run of 50 steps, at most 4 accelerators); the N ranks of the toy CNN share
   the host's one GPU.

A part `pipebench run`s as a user types it: its transcript is <part>.txt, its tables and plots are
in <part>/ (the job folders, traces included, stay under results/gpu_check/). timings.json: each
part's seconds, rewritten as each part ends.

Budget, from the first H100 run (2026-11-22): 8 jobs at batch 256 with the default run settings took
7.5 minutes, about a minute a job: some 15-25 s of start-up (process, CUDA context, profiler) and
the rest steps of 0.4 to 2.8 s, many of them warm-up (workers x prefetch) and profiled steps
beyond the 20 measured. Here 6 jobs at batch 64 (steps 4x shorter) measure 10 steps after 2
warm-up and profile 1: about 2.5 minutes; the tests about 2 (their end-to-end test runs 4 tiny jobs).
On the H100 host (2026-11-26) the tests took 126 s and the backends' 3 jobs 134 s. The overhead
part runs 4 rounds of 3 loops a backend, each a fresh 8-worker start: about 5 minutes (estimated, not
yet run): a full run leaves it out, to stay inside one 10-minute device call. So does the storage part:
each check is a search of some 4 rounds and 2 runs of resnet50's 224 ms step, each job with its
start-up, about 3 minutes a check (estimated, not yet run on a GPU).
"""

import argparse
import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "fixtures" / "gpu" / "recorded"
RESULTS_DIR = ROOT / "results" / "gpu_check"
# Categories and args the analyses read; everything else is dropped to keep fixtures small.
KEEP_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation"}
KEEP_ARGS = {"stream", "correlation", "device", "External id", "bytes"}
# summary.csv columns written to expected.json: what tests/test_gpu_trace.py checks the analyses against.
EXPECTED_NUMBERS = ("gpu_busy_pct", "syncs_per_step", "idle_host_wait_pct", "idle_kernel_wait_pct", "idle_other_pct",
                    "sync_wait_ms_per_step")
# Measured, warm-up (at least workers x prefetch) and profiled steps of a full run, at batch 64, not
# the seed's 256: a workers=0 step of the seed chain took 2.8 s at 256 on the H100 host.
FULL_RUN = ("run.warmup_steps=2", "run.steps=10", "run.min_time_s=1", "run.profile_steps=1", "run.progress=false",
            "loader.batch_size=64")
QUICK_RUN = ("run=quick", "run.progress=false", "loader.batch_size=32")
GPU_TESTS = ("tests/test_gpu_trace.py", "tests/test_gpu_job.py", "tests/test_masked_loss.py",
             "tests/test_alloc_churn.py", "tests/test_gpu_util.py", "tests/test_consumers.py",
             "tests/test_async_steps.py",
             # The CUDA tests of files that are otherwise CPU tests (CI runs the rest of each).
             "tests/test_equivalence.py::"
             "test_gpu_decoder_on_cuda_is_close_without_chroma_subsampling_and_says_why_with_it",
             "tests/test_region_decode.py::test_gpu_backend_decodes_the_same_region",
             "tests/test_gpu_region_decode.py::test_the_cuda_path_decodes_the_batch_of_regions_on_the_gpu",
             "tests/test_attach_gpu_clock.py::test_on_cuda_the_watched_loop_reads_starvation_from_the_gpus_timeline",
             "tests/test_torchcodec_decode.py::test_torchcodec_decodes_a_batch_on_cuda_to_the_stored_pixels")
# The slowest GPU test (4 tiny jobs through the CLI); --quick leaves it out.
END_TO_END_TEST = "tests/test_gpu_job.py::test_on_cuda_the_jobs_report_gpu_timings_syncs_idle_and_allocator"
# Files of a results folder worth keeping beside the transcript (the traces stay in the job folders).
PUBLISHED_SUFFIXES = (".csv", ".md", ".png")


@dataclass(frozen=True)
class Part:
    """One `pipebench run`: its name (its files' names in the output folder) and overrides."""

    name: str
    overrides: Tuple[str, ...]


SEED = Part("seed", ("transform=yuv_mask", "loader=seed", "consumer=toy_cnn", "workers=0,8"))
GPU = Part("gpu", ("transform=yuv_mask_fast", "loader=seed", "consumer=masked_loss_sync,masked_loss_fixed,toy_cnn",
                   "workers=4", "loader.pin_memory=true"))
# Issue 27's backends on a many-core host feeding a real GPU: processes against threads.
BACKENDS = Part("backends", ("transform=yuv_mask_fast", "loader=seed", "consumer=toy_cnn", "workers=8",
                             "loader.backend=dataloader,threads,spdl"))
PAGEABLE = Part("pageable", ("transform=yuv_mask_fast", "loader=seed", "consumer=toy_cnn", "workers=4",
                             "loader.pin_memory=false"))
# Issue 27's overhead target at 8 workers: a window of whole cycles (64 steps) after a warm-up of
# workers x prefetch, 4 counterbalanced rounds (3 gave ranges of 5% on the H200 host).
OVERHEAD_ARGS = ("--rounds", "4", "--workers", "8", "--warmup", "16", "--steps", "15")
# Issue 53's GPU target: the resnet50 preset with the toy CNN in place of the sleep, beside the sleep,
# shortened (1 run of 50 steps, at most 4 accelerators) to fit both checks into one device call. Both
# through ImageNet's chain cropped to 256: the toy CNN takes a square of a power-of-two side.
STORAGE_CHECK = ("storage-check", "workload=resnet50", "accelerator=h100", "transform=imagenet",
                 "transform.per_sample.0.size=256", "storage_check.runs=1", "run.steps=50",
                 "storage_check.max_accelerators=4", "trace=none")
STORAGE_CONSUMERS = ("emulated", "toy_cnn")
# Which recorded job each fixture comes from (all in part 2).
FIXTURE_JOBS = ("masked_loss_sync", "masked_loss_fixed", "toy_cnn")


class Timings:
    """Each part's wall seconds, in timings.json, rewritten as each part ends."""

    def __init__(self, out: Path) -> None:
        self.path = out / "timings.json"
        self.seconds: Dict[str, float] = {}
        self.start = time.perf_counter()

    def done(self, part: str, started: float) -> None:
        self.seconds[part] = round(time.perf_counter() - started, 1)
        self.seconds["total"] = round(time.perf_counter() - self.start, 1)
        self.path.write_text(json.dumps(self.seconds, indent=1) + "\n")
        print(f"gpu_check: {part} done in {self.seconds[part]:.0f} s ({self.seconds['total']:.0f} s in all)",
              flush=True)


def tee(command: Sequence[str], transcript: Path) -> Tuple[int, str]:
    """Run `command` from the checkout; its output streams to the console and into `transcript`."""
    print("$ " + " ".join(command), flush=True)
    lines = []
    with open(transcript, "w") as log, subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                                                        stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
            log.flush()
            lines.append(line)
    return proc.returncode, "".join(lines)


def pipebench(args: Sequence[str], transcript: Path) -> str:
    """The installed console script, as a user runs it; exits on failure, else returns its output."""
    status, output = tee([str(Path(sys.executable).with_name("pipebench")), *args], transcript)
    if status != 0:
        raise SystemExit(f"gpu_check: `pipebench {args[0]}` exited {status}; see {transcript}")
    return output


def publish(folder: Path, dest: Path, suffixes: Sequence[str] = PUBLISHED_SUFFIXES) -> None:
    """Copy a results folder's tables and plots (not its job folders) into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.is_file() and path.suffix in suffixes:
            shutil.copy2(path, dest / path.name)


def results_of(output: str) -> Path:
    """The results folder a command's last line names (`results: <folder>`), from the checkout."""
    folder = Path(output.strip().splitlines()[-1].removeprefix("results: "))
    return folder if folder.is_absolute() else ROOT / folder


def run_part(part: Part, settings: Sequence[str], out: Path) -> Path:
    """`pipebench run` the part, then publish its tables; returns its results folder."""
    folder = results_of(pipebench(["run", *part.overrides, *settings, f"results_dir={RESULTS_DIR}"],
                                  out / f"{part.name}.txt"))
    publish(folder, out / part.name)
    return folder


def storage_part(out: Path) -> None:
    """Part 7: the resnet50 check with each consumer; each check's report.md and verdict.json into storage/."""
    for consumer in STORAGE_CONSUMERS:
        folder = results_of(pipebench([*STORAGE_CHECK, f"consumer={consumer}", f"results_dir={RESULTS_DIR}"],
                                      out / f"storage-{consumer}.txt"))
        publish(folder, out / "storage" / consumer, (*PUBLISHED_SUFFIXES, ".json"))  # verdict.json too


def trimmed(trace_path: Path) -> Dict[str, object]:
    raw = json.loads(trace_path.read_text())
    events = [
        {**{k: e[k] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur") if k in e},
         "args": {k: v for k, v in (e.get("args") or {}).items() if k in KEEP_ARGS}}
        for e in raw["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in KEEP_CATEGORIES
    ]
    return {"_comment": f"RECORDED on {torch.cuda.get_device_name(0)} by benchmarks/gpu_check.py, trimmed",
            "traceEvents": events}


def job(folder: Path, consumer: str) -> Tuple[Dict[str, str], Path]:
    """The summary row and job folder of the `consumer` job under `folder`."""
    with open(folder / "summary.csv") as f:
        rows = {row["job"]: row for row in csv.DictReader(f)}
    for path in sorted(folder.glob("job-*/result.json")):
        summary = json.loads(path.read_text())["summary"]
        if summary["consumer"] == consumer:
            return rows[summary["job"]], path.parent
    raise SystemExit(f"gpu_check: no {consumer} job under {folder}")


def _number(text: str) -> Optional[float]:
    return float(text) if text else None


def record_fixtures(folder: Path, dest: Path) -> None:
    """The three jobs' trimmed traces (gzipped) and what they reported, into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    expected = {}
    for name in FIXTURE_JOBS:
        row, job_dir = job(folder, name)
        out = dest / f"{name}_trace.json.gz"
        # mtime=0: the same trace gives the same bytes, so a re-recording diffs only where it differs.
        out.write_bytes(gzip.compress(json.dumps(trimmed(job_dir / "gpu_trace.json")).encode(), mtime=0))
        expected[name] = {**{key: _number(row[key]) for key in EXPECTED_NUMBERS}, "sync_ops": row["sync_ops"],
                          "source_job": row["job"]}
        print(f"recorded {out} ({out.stat().st_size // 1024} KiB)", flush=True)
    (dest / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


def run_tests(out: Path, quick: bool) -> int:
    pytest = [str(Path(sys.executable).with_name("pytest")), "-q", "-p", "no:cacheprovider", *GPU_TESTS,
              *(["--deselect", END_TO_END_TEST] if quick else [])]
    status, _ = tee(pytest, out / "tests.txt")
    return status


# Every part, in the order a full run takes them; --parts picks some, in its own order, and can
# name the overhead part, which a full run leaves out (its own budget, in the module doc).
FULL_PARTS = ("seed", "gpu", "pageable", "backends", "tests")
PARTS = (*FULL_PARTS, "overhead", "storage")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="part 2 at run=quick, and the tests but the 4-job one")
    parser.add_argument("--parts", type=lambda text: text.split(","), default=None,
                        help=f"comma-separated parts to run, of {','.join(PARTS)} (default: all but overhead "
                             "and storage; "
                             "--quick: gpu,tests)")
    parser.add_argument("--update-fixtures", action="store_true",
                        help=f"copy the recorded fixtures into {RECORDED.relative_to(ROOT)} (commit them)")
    parser.add_argument("--out", type=Path, help="output folder (default: $OUT, else results/gpu_check)")
    args = parser.parse_args(argv)
    parts = args.parts or (["gpu", "tests"] if args.quick else list(FULL_PARTS))
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {','.join(unknown)}: choose from {','.join(PARTS)}")
    if "pageable" in parts and "gpu" not in parts[:parts.index("pageable")]:
        parser.error("part pageable is compared with part gpu: name gpu before it")
    if not torch.cuda.is_available():
        print("pipebench: error: gpu_check needs a CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    out = (args.out or Path(os.environ.get("OUT") or RESULTS_DIR)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    timings = Timings(out)
    settings = QUICK_RUN if args.quick else FULL_RUN
    status = 0
    for name in parts:
        started = time.perf_counter()
        if name == "seed":
            run_part(SEED, settings, out)
        elif name == "gpu":
            gpu = run_part(GPU, settings, out)
            record_fixtures(gpu, out / "fixtures")
            if args.update_fixtures:
                shutil.copytree(out / "fixtures", RECORDED, dirs_exist_ok=True)
                print(f"updated {RECORDED}: commit it", flush=True)
        elif name == "pageable":
            pageable = run_part(PAGEABLE, settings, out)
            pipebench(["report", str(gpu), str(pageable), "--out", str(out / "pinning")], out / "pinning.txt")
        elif name == "backends":
            run_part(BACKENDS, settings, out)
        elif name == "overhead":
            measured, _ = tee([sys.executable, str(ROOT / "benchmarks" / "backend_overhead.py"), *OVERHEAD_ARGS],
                              out / "overhead.txt")
            status = status or measured
        elif name == "storage":
            storage_part(out)
        else:
            status = run_tests(out, args.quick) or status
        timings.done(name, started)
    return status


if __name__ == "__main__":
    sys.exit(main())
