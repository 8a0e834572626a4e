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
import statistics
from typing import List, Optional

import torch

from pipebench.config.compose import compose_job_spec
from pipebench.measure.reference import harness_loop, plain_loop, window_spec

# Issues #2 and #3's target: the harness costs at most this much throughput.
TARGET_OVERHEAD_PCT = 3.0


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
        spec = window_spec(compose_job_spec([*args.overrides, f"workers={workers}"]), args.steps, args.warmup)
        plain, timed, spread = [], [], []
        for _ in range(args.rounds):
            first, timed_rate, second = (measure(spec).samples_per_s for measure in (plain_loop, harness_loop, plain_loop))
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
