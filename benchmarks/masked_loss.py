"""The masked loss alone, sync vs fixed variant: time per call (forward + backward) with torch.utils.benchmark.

    python benchmarks/masked_loss.py                 # CPU, and CUDA when present
    python benchmarks/masked_loss.py --batch 256 --min-run-time 2

In a training step the toy CNN dominates; this isolates the part the two variants differ in.
On CUDA torch.utils.benchmark synchronises around each measurement, so the sync variant's
waits are in its time. Prints one markdown row per device.
"""

import argparse

import torch
from torch.utils import benchmark

from pipebench.pipeline.masked_loss import masked_loss_fixed, masked_loss_sync

CLASSES = 10


def per_call_us(fn, logits: torch.Tensor, labels: torch.Tensor, min_run_time: float) -> float:
    """Median µs of one forward + backward of `fn` (torch.utils.benchmark's blocked autorange)."""
    # One thread: a loss over 256 x 10 logits gains nothing from more, and one is steadier on a shared machine.
    timer = benchmark.Timer(stmt="fn(x, y).backward()", globals={"fn": fn, "x": logits, "y": labels}, num_threads=1)
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds per measurement")
    args = parser.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"batch {args.batch}, {CLASSES} classes, forward + backward, median per call\n")
    print("| device | sync µs | fixed µs | sync / fixed |")
    print("|---|---:|---:|---:|")
    for device in devices:
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(args.batch, CLASSES, generator=g).to(device).requires_grad_(True)
        labels = torch.randint(0, CLASSES, (args.batch,), generator=g).to(device)
        sync = per_call_us(masked_loss_sync, logits, labels, args.min_run_time)
        fixed = per_call_us(masked_loss_fixed, logits, labels, args.min_run_time)
        print(f"| {device} | {sync:.1f} | {fixed:.1f} | {sync / fixed:.2f} |")


if __name__ == "__main__":
    main()
