"""Overhead of pipebench's full meter against a plain hand-written DataLoader loop.

The harness side is the real job code (`measure_job`: timed chain inside workers, per-step
records, memory sampler, consumer); the plain side is `pipebench.measure.reference.plain_loop`. Both
read the same dataset through the same chain with the same sampler seed, DataLoader settings
and consumer. Each round runs plain, harness, plain, so drift hits both alike, and the two
plain runs give an A/A figure: the noise floor below which no overhead can be resolved on
this machine. Prints medians over rounds.

    python benchmarks/overhead.py                       # seed chain (fast dilation), workers 0 and 2
    python benchmarks/overhead.py transform=yuv_mask consumer=emulated --workers 2 --rounds 6
"""

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path
from typing import List, Optional

import torch

from pipebench.config.compose import compose_job_spec
from pipebench.config.specs import JobSpec
from pipebench.measure.job import measure_job
from pipebench.measure.reference import plain_loop

# Issues #2 and #3's target: the harness costs at most this much throughput.
TARGET_OVERHEAD_PCT = 3.0


def harness_rate(spec: JobSpec, steps: int, warmup: int) -> float:
    run = dataclasses.replace(spec.run, steps=steps, warmup_steps=warmup, min_time_s=0.0, repeats=1,
                              profile_steps=0, progress=False)
    with tempfile.TemporaryDirectory() as job_dir:
        return measure_job(dataclasses.replace(spec, run=run), Path(job_dir))["summary"]["samples_per_s"]


def plain_rate(spec: JobSpec, steps: int, warmup: int) -> float:
    run = dataclasses.replace(spec.run, warmup_steps=warmup)
    return plain_loop(dataclasses.replace(spec, run=run), steps).samples_per_s


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("overrides", nargs="*", default=["transform=yuv_mask_fast", "consumer=none"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"overrides: {' '.join(args.overrides)}; {args.rounds} rounds x {args.steps} steps, interleaved\n")
    print("| workers | plain samples/s | pipebench samples/s | overhead % | A/A plain vs plain % |")
    print("|---:|---:|---:|---:|---:|")
    for workers in args.workers:
        spec = compose_job_spec([*args.overrides, f"workers={workers}"])
        plain, timed, spread = [], [], []
        for _ in range(args.rounds):
            first, timed_rate, second = (measure(spec, args.steps, args.warmup)
                                         for measure in (plain_rate, harness_rate, plain_rate))
            plain.append((first + second) / 2)
            timed.append(timed_rate)
            spread.append(abs(first - second) / plain[-1] * 100)
        overhead = statistics.median((p - t) / p * 100 for p, t in zip(plain, timed))
        print(f"| {workers} | {statistics.median(plain):.1f} | {statistics.median(timed):.1f} | "
              f"{overhead:+.2f} | {statistics.median(spread):.2f} |")
    print(f"\ntarget: overhead within {TARGET_OVERHEAD_PCT}% (negative: pipebench measured faster); "
          "an overhead smaller than the A/A spread is below this machine's noise floor")


if __name__ == "__main__":
    main()
