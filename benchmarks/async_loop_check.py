"""On a GPU: pipebench's asynchronous step loop against a hand-written asynchronous training loop.

The hand-written side (`pipebench.measure.reference.plain_loop(spec, run_ahead=True)`) is the
seed's CNN trained as training runs: pin_memory=True, `.to(device, non_blocking=True)`, no
`.item()` and no synchronisation inside a step; the GPU is synchronised once before its timed
steps and once after them. The pipebench side is the real job measurement (`measure_job`) at
run.sync=async. They run alternately, round after round, at a data-bound setting (the seed
chain, 4 workers) and a GPU-bound one (the fastest chain explore finds, 16 workers). Prints the
samples/s ratio (pipebench / hand-written; target 0.97-1.03) and pipebench's GPU-busy share
(`accel_util_pct`, from CUDA events) against NVML's utilisation over the same window (within 3
points), with PASS or FAIL. On a machine without CUDA it says so and exits 0: nothing to measure.

    python benchmarks/async_loop_check.py
    python benchmarks/async_loop_check.py --rounds 3 --steps 20 dataset.length=40000
"""

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from plain_loop_check import RATIO_HIGH, RATIO_LOW, check_epoch_covers_window

from pipebench.config.compose import compose_job_spec
from pipebench.config.specs import SYNC_ASYNC
from pipebench.measure.reference import harness_summary, plain_loop, window_spec
from pipebench.measure.setup import quiet_torch_output

# The target: pipebench's GPU-busy share reads what NVML reads.
NVML_POINTS = 3.0
# Both loops: the seed's loader (batch 256, pinned) into the toy CNN for real, persistent workers,
# and an epoch long enough for 16 workers' start-up backlog plus the window (the synthetic corpus
# is one photo repeated, so its length costs nothing).
SETTINGS = ("loader=seed", "consumer=toy_cnn", "loader.pin_memory=true", "loader.persistent_workers=true",
            "run.sync=async", "dataset.length=40000")
# Workers -> chain: the seed chain is data-bound at 4 workers (9% busy on the H100 host); the
# crop-first fast chain at 16 workers feeds the GPU.
CASES = {4: "transform=yuv_mask", 16: "transform=yuv_mask_crop_first"}


@dataclass(frozen=True)
class Round:
    hand_samples_per_s: float
    samples_per_s: float
    accel_util_pct: float
    nvml_pct: Optional[float]

    @property
    def ratio(self) -> float:
        return self.samples_per_s / self.hand_samples_per_s


def one_round(spec) -> Round:
    hand = plain_loop(spec, run_ahead=True)
    summary = harness_summary(spec)
    if summary.step_sync != SYNC_ASYNC:
        raise SystemExit(f"async_loop_check: pipebench ran step_sync={summary.step_sync}, not async")
    return Round(hand.samples_per_s, summary.samples_per_s, summary.accel_util_pct, summary.gpu_util_pct)


def verdict(rounds: List[Round]) -> str:
    ratio = statistics.median(r.ratio for r in rounds)
    gaps = [r.accel_util_pct - r.nvml_pct for r in rounds if r.nvml_pct is not None]
    nvml_ok = bool(gaps) and abs(statistics.median(gaps)) <= NVML_POINTS
    return "PASS" if RATIO_LOW <= ratio <= RATIO_HIGH and nvml_ok else "FAIL"


def table(results: Dict[int, List[Round]]) -> str:
    lines = ["| workers | chain | hand-written samples/s | pipebench samples/s | ratio (range) | target | "
             "accel_util_pct | NVML % | difference, points | target | verdict |",
             "|---:|---|---:|---:|---|---|---:|---:|---:|---|---|"]
    for workers, rounds in results.items():
        ratios = [r.ratio for r in rounds]
        nvml = [r.nvml_pct for r in rounds if r.nvml_pct is not None]
        accel = statistics.median(r.accel_util_pct for r in rounds)
        nvml_text = f"{statistics.median(nvml):.1f}" if nvml else "not measured"
        gaps = [r.accel_util_pct - r.nvml_pct for r in rounds if r.nvml_pct is not None]
        gap = f"{statistics.median(gaps):+.1f}" if gaps else "-"
        lines.append(f"| {workers} | {CASES[workers].split('=')[1]} "
                     f"| {statistics.median(r.hand_samples_per_s for r in rounds):.1f} "
                     f"| {statistics.median(r.samples_per_s for r in rounds):.1f} "
                     f"| {statistics.median(ratios):.3f} ({min(ratios):.3f}–{max(ratios):.3f}) | {RATIO_LOW}–{RATIO_HIGH} "
                     f"| {accel:.1f} | {nvml_text} | {gap} | ±{NVML_POINTS:g} | {verdict(rounds)} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per setting")
    parser.add_argument("--steps", type=int, default=30, help="measured steps in each loop")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps (at least workers x prefetch)")
    parser.add_argument("overrides", nargs="*", help="more config overrides, after the settings")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("async_loop_check: needs a CUDA GPU (torch.cuda.is_available() is False); nothing measured")
        return 0
    quiet_torch_output()
    torch.set_num_threads(1)  # as pipebench's workers=0 jobs run; both loops share this process
    specs = {w: window_spec(compose_job_spec([*SETTINGS, chain, f"workers={w}", *args.overrides]), args.steps,
                            args.warmup) for w, chain in CASES.items()}
    for spec in specs.values():
        check_epoch_covers_window(spec)
    print(f"settings: {' '.join(SETTINGS)}; {args.rounds} rounds of hand-written then pipebench, "
          f"{args.steps} steps each", flush=True)
    started = time.perf_counter()
    results: Dict[int, List[Round]] = {w: [] for w in specs}
    for number in range(args.rounds):
        for workers, spec in specs.items():
            result = one_round(spec)
            results[workers].append(result)
            print(f"round {number + 1} workers={workers}: hand-written {result.hand_samples_per_s:.1f}/s, pipebench "
                  f"{result.samples_per_s:.1f}/s, accel_util_pct {result.accel_util_pct:.1f}, NVML {result.nvml_pct}",
                  flush=True)
    print(f"\n{table(results)}\n")
    print(f"medians of the per-round pairs ({time.perf_counter() - started:.0f} s); device: "
          f"{torch.cuda.get_device_name(0)}")
    return 0 if all(verdict(rounds) == "PASS" for rounds in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
