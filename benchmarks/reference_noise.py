"""How much does the CPU reference's round figure move when nothing changes? Which statistic moves least?

The CPU reference (pipebench/measure/cpu_reference.py) is one sample of the calibration
workload, run in each worker between batches; compare divides the chain's CPU ms a sample by
its round figure. Its own noise goes straight into that quotient. Here DataLoader workers run
the seed chain and probe the reference every `--every` samples. It prints one run's spread,
its quantiles (two modes show as a gap between the quartiles), and, for rounds of 10 and 25
runs drawn from them, how far each statistic moves round to round (its SD over its mean).

    python benchmarks/reference_noise.py                     # 2 workers, 90 s
    python benchmarks/reference_noise.py --workers 4 --seconds 60
"""

import argparse
import time
from typing import Callable, Dict, List

import numpy as np
import torch
from scipy import stats
from torch.utils.data import DataLoader, Dataset

from pipebench.measure.cpu_reference import CpuReference, run_workload, seed_chain, synthetic_jpeg

# Distinct photos for the chain, so its samples are not the reference's one photo.
CHAIN_PHOTOS = 8
BATCH_SIZE = 32
# Round sizes to compare: about what a 2% reference holds in one round here, and 2.5 times that.
ROUND_RUNS = (10, 25)
# Random rounds drawn from the pooled runs for each size.
DRAWS = 2000
STATISTICS: Dict[str, Callable[[np.ndarray], float]] = {
    "median": np.median,
    "mean": np.mean,
    "trimmed 10%": lambda x: stats.trim_mean(x, 0.1),
    "trimmed 20%": lambda x: stats.trim_mean(x, 0.2),
}


class ChainWithProbes(Dataset):
    """The seed chain on a few photos; every `every`-th sample a worker also probes the reference."""

    def __init__(self, every: int) -> None:
        self.photos = [synthetic_jpeg(seed) for seed in range(1, CHAIN_PHOTOS + 1)]
        self.chain = seed_chain()
        self.reference = CpuReference()
        self.every = every
        self.served = 0

    def __len__(self) -> int:
        return 10 ** 9

    def __getitem__(self, index: int) -> int:
        run_workload(self.photos[index % CHAIN_PHOTOS], self.chain)
        self.served += 1
        return self.reference.probe() if self.served % self.every == 0 else 0


def probe_costs_ms(workers: int, seconds: float, every: int) -> np.ndarray:
    loader = DataLoader(ChainWithProbes(every), batch_size=BATCH_SIZE, num_workers=workers,
                        collate_fn=torch.tensor)
    costs: List[int] = []
    deadline = time.monotonic() + seconds
    for batch in loader:
        costs += [int(ns) for ns in batch if ns > 0]
        if time.monotonic() > deadline:
            break
    return np.asarray(costs) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--every", type=int, default=10, help="probe once every this many samples a worker")
    args = parser.parse_args()
    costs = probe_costs_ms(args.workers, args.seconds, args.every)
    centre = float(np.median(costs))
    print(f"{len(costs)} runs at {args.workers} workers: median {centre:.2f} ms, mean {costs.mean():.2f} ms "
          f"({costs.mean() / centre - 1:+.1%}), SD/median {costs.std() / centre:.3f}")
    print("quantiles 0/10/25/50/75/90/100%:", np.round(np.quantile(costs, [0, .1, .25, .5, .75, .9, 1]), 2))
    rng = np.random.default_rng(0)
    print("| runs a round | " + " | ".join(STATISTICS) + " |")
    print("|---|" + "---|" * len(STATISTICS))
    for runs in ROUND_RUNS:
        rounds = [rng.choice(costs, runs, replace=False) for _ in range(DRAWS)]
        moves = []
        for statistic in STATISTICS.values():
            figures = np.array([statistic(r) for r in rounds])
            moves.append(f"{figures.std() / figures.mean():.3f}")
        print(f"| {runs} | " + " | ".join(moves) + " |")


if __name__ == "__main__":
    main()
