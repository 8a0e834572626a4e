"""On a GPU machine, in one step: run the GPU benchmarks, record trace fixtures, run the GPU tests.

    python benchmarks/gpu_check.py            # full runs (a few minutes on a 16-core GPU box)
    python benchmarks/gpu_check.py --quick    # run=quick: a smoke test of the same commands

1. The seed chain (`loader=seed`, batch 256) feeding the toy CNN at workers=0,4,8,16.
2. The masked-loss pair at workers=4: syncs per step and the step-time ratio.
3. The toy CNN at workers=4 with pin_memory true and false: the pinned / pageable H2D split.
4. Copies three of the runs' gpu_trace.json, trimmed to the events and fields the analyses read,
   into tests/fixtures/gpu/recorded/ with expected.json (what the runs reported), so
   tests/test_gpu_trace.py checks the analyses against real recordings from then on.
5. Runs the GPU-related tests (the CUDA-only ones no longer skip).

Prints each run's tables (the `pipebench run` output) and the test summary. Commit the
recorded fixtures afterwards.
"""

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import torch

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "fixtures" / "gpu" / "recorded"
RESULTS_DIR = "results/gpu_check"
# Categories and args the analyses read; everything else is dropped to keep fixtures small.
KEEP_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation"}
KEEP_ARGS = {"stream", "correlation", "device", "External id", "bytes"}
RUNS = {
    "seed_toy_cnn": ["transform=yuv_mask", "loader=seed", "consumer=toy_cnn", "workers=0,4,8,16"],
    "masked_loss": ["transform=yuv_mask_fast", "loader=seed", "consumer=masked_loss_sync,masked_loss_fixed",
                    "workers=4"],
    "pinning": ["transform=yuv_mask_fast", "loader=seed", "consumer=toy_cnn", "workers=4",
                "loader.pin_memory=true,false"],
}
GPU_TESTS = ["tests/test_gpu_trace.py", "tests/test_gpu_job.py", "tests/test_masked_loss.py",
             "tests/test_alloc_churn.py", "tests/test_gpu_util.py", "tests/test_consumers.py"]


def run(overrides: List[str], quick: bool) -> Path:
    """`pipebench run` as a user types it; its output streams through; returns the results folder."""
    exe = Path(sys.executable).with_name("pipebench")
    args = [str(exe), "run", *overrides, f"results_dir={RESULTS_DIR}", *(["run=quick"] if quick else [])]
    print("$ " + " ".join(["pipebench", *args[1:]]), flush=True)
    proc = subprocess.run(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    print(proc.stdout, flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"gpu_check: `pipebench run` exited {proc.returncode}")
    return ROOT / proc.stdout.strip().splitlines()[-1].removeprefix("results: ")


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


def job(folder: Path, **match: str) -> Dict[str, object]:
    """The summary row and job folder of the job whose summary matches `match`."""
    with open(folder / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    for path in sorted(folder.glob("job-*/result.json")):
        summary = json.loads(path.read_text())["summary"]
        if all(str(summary.get(k)) == v for k, v in match.items()):
            row = next(r for r in rows if r["job"] == summary["job"])
            return {"row": row, "dir": path.parent}
    raise SystemExit(f"gpu_check: no job with {match} under {folder}")


def record_fixtures(masked: Path, pinning: Path) -> None:
    RECORDED.mkdir(parents=True, exist_ok=True)
    expected = {}
    picks = {
        "masked_loss_sync": job(masked, consumer="masked_loss_sync"),
        "masked_loss_fixed": job(masked, consumer="masked_loss_fixed"),
        "toy_cnn": job(pinning, consumer="toy_cnn", pin_memory="True"),
    }
    for name, picked in picks.items():
        out = RECORDED / f"{name}_trace.json"
        out.write_text(json.dumps(trimmed(picked["dir"] / "gpu_trace.json")))
        row = picked["row"]
        expected[name] = {"gpu_busy_pct": float(row["gpu_busy_pct"]), "syncs_per_step": float(row["syncs_per_step"]),
                          "source_job": row["job"]}
        print(f"recorded {out.relative_to(ROOT)} ({out.stat().st_size // 1024} KiB)")
    (RECORDED / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="run=quick for every run (a smoke test)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("pipebench: error: gpu_check needs a CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        raise SystemExit(2)
    folders = {name: run(overrides, args.quick) for name, overrides in RUNS.items()}
    record_fixtures(folders["masked_loss"], folders["pinning"])
    tests = subprocess.run([str(Path(sys.executable).with_name("pytest")), "-q", *GPU_TESTS], cwd=ROOT)
    raise SystemExit(tests.returncode)


if __name__ == "__main__":
    main()
