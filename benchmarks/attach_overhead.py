"""What `pipebench attach` adds to the step time of the script it watches: bare against attached.

One small synthetic training script (a dataset of uint8 images whose `transform` is a v2 ImageNet-like
Compose, RandomResizedCrop to 112, flip, ToDtype, Normalize; a DataLoader of batch 32; a one-conv
model trained with SGD on the CPU) is run as its own process, bare
(`python train.py`) and attached (`pipebench attach --steps ALL -- python train.py`, the window
over every step after the first, so the whole loop is measured and its recipe timed), alternately,
round after round (ABAB...), so drift hits both alike. The script times its own loop (first batch
excluded: worker start-up is not a step) and prints it; the figure is the median of the per-round
ratios attached / bare, against issue 25's target of at most 3%.

    python benchmarks/attach_overhead.py                        # workers 0 and 2, 5 rounds
    python benchmarks/attach_overhead.py --workers 2 --rounds 9 --steps 300
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import List, Sequence

# Issue 25's target: attach adds at most 3% to the step time of the script it watches.
TARGET_RATIO = 1.03
DEFAULT_ROUNDS = 5
DEFAULT_STEPS = 200
DEFAULT_WORKERS = (0, 2)
# What the script prints before its loop time, so attach's own table is not mistaken for it.
LOOP_TAG = "LOOP_S"

SCRIPT = textwrap.dedent("""
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    from torchvision.transforms import v2

    WORKERS, STEPS = int(sys.argv[1]), int(sys.argv[2])
    SIZE = 112
    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Noise(Dataset):
        transform = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip(),
                                v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.25] * 3)])
        def __init__(self):
            self.images = torch.randint(0, 255, (64, 3, 160, 160), dtype=torch.uint8)
        def __len__(self):
            return 1 << 20
        def __getitem__(self, i):
            return self.transform(self.images[i % 64]), i % 10

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.LazyLinear(10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model(torch.zeros(1, 3, SIZE, SIZE))  # the lazy layer takes its shape
    loader = DataLoader(Noise(), batch_size=32, num_workers=WORKERS)
    start = None
    for n, (x, y) in enumerate(loader):
        if n == 0:
            start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if n == STEPS:
            break
    print("{tag}", time.perf_counter() - start)
""").replace("{tag}", LOOP_TAG)


def loop_seconds(command: Sequence[str]) -> float:
    """Run one process; the loop time the script printed."""
    out = subprocess.run(list(command), capture_output=True, text=True, check=True).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith(LOOP_TAG)))


def overhead_ratios(script: Path, out: Path, workers: int, steps: int, rounds: int) -> List[float]:
    """Per round: attached loop time / bare loop time, the two runs back to back (order alternating)."""
    bare = [sys.executable, str(script), str(workers), str(steps)]
    attached = [sys.executable, "-m", "pipebench.cli.main", "attach", "--steps", str(steps), "--skip-steps", "0",
                "--out", str(out), "--", *bare[1:]]
    ratios = []
    for round_num in range(rounds):
        if round_num % 2 == 0:
            b, a = loop_seconds(bare), loop_seconds(attached)
        else:
            a, b = loop_seconds(attached), loop_seconds(bare)
        ratios.append(a / b)
        print(f"workers={workers} round {round_num}: bare {b:.3f} s, attached {a:.3f} s, ratio {a / b:.4f}",
              flush=True)
    return ratios


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=list(DEFAULT_WORKERS))
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    args = parser.parse_args(list(argv) or None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPT)
        for workers in args.workers:
            ratios = overhead_ratios(script, Path(tmp) / f"out-{workers}", workers, args.steps, args.rounds)
            median = statistics.median(ratios)
            rows.append(f"| {workers} | {args.rounds} | {median:.4f} | {min(ratios):.4f}..{max(ratios):.4f} | "
                        f"{'PASS' if median <= TARGET_RATIO else 'FAIL'} |")
    print("\n| workers | rounds | attached / bare (median) | range | target <= 1.03 |\n|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
