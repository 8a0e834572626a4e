"""What `pipebench attach` adds to a realistic training script, and whether its starvation is the script's own.

The script is the issue's realistic one: a torchvision `ImageFolder` of 240x320 JPEGs drawn as the
default corpus draws its pictures, a v2 recipe (RandomResizedCrop 128, flip, ToImage,
ToDtype, Normalize), batch 16, a small CNN trained with SGD on the CPU for a few hundred steps.
Its loop is written by hand to time itself: the time blocked in `next()` and the step after it,
over the very steps attach measures (the first batch out, `--skip-steps` warm-up, then `--steps`),
so its own starvation, Σ wait / Σ (wait + step), is the reference attach must match.

Each round runs the script bare (`python train.py`) and attached (`pipebench attach -- python
train.py`), back to back, the order alternating (ABAB...), so drift hits both alike. Printed per
worker count: the median of the per-round loop-time ratios attached / bare against issue 25's 3%,
the same for the main process's CPU time over the loop (other tenants move wall time far more than
CPU time; at workers=0 every sample is made in that process, so it holds all that attach adds),
and attach's starvation against the script's own in the same run and in the bare run, against
its 3 points. The data set is larger than the window, so no epoch restart falls inside it.

A round's loop time moves 5-10% on a shared host, as much as the target, so a second figure is
taken in one process (`--blocks N`, at workers=0 where every sample attach times is made in the
loop): the same recipe, model and step, one loader watched by `pipebench.watch` and a twin left
bare, stepped in alternating blocks of BLOCK_STEPS, so the host's drift falls on both alike; the
loaders read in order and each pair of blocks draws its crops from one seed, so a pair does the
same work on both sides. It holds everything attach adds to a step and a sample (the timed
recipe, the load and collate timings riding with the batch, the loop's bookkeeping, the meters'
readings); not the process's own difference (attach's imports, runpy), which the rounds hold.

    python benchmarks/attach_overhead.py                        # workers 0 and 2, 5 rounds, 100 blocks
    python benchmarks/attach_overhead.py --workers 2 --rounds 9 --steps 300 --blocks 0
"""

import argparse
import csv
import functools
import runpy
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

import pipebench
from pipebench.datasets.synthetic_jpeg import draw_picture

# Issue 25's targets: attach adds at most 3% to the step time of the script it watches, and its
# starvation is within 3 points of a hand-written loop's on the same pipeline.
TARGET_RATIO = 1.03
TARGET_POINTS = 3.0
DEFAULT_ROUNDS = 5
DEFAULT_STEPS = 200
DEFAULT_SKIP = 5
DEFAULT_WORKERS = (0, 2)
BATCH = 16
# ImageNet-like photos are larger; this keeps a round near ten seconds on a 2-core machine.
IMAGE_HW = (240, 320)
CLASSES = ("cat", "dog")
# Distinct pictures drawn (about 10 ms each); the files cycle through them. Decoding costs the same
# whether or not two files hold the same picture.
PICTURES = 64
# What the script prints before its figures, so attach's own table is not mistaken for them.
LOOP_TAG = "LOOP"
# In-process blocks: steps a block (about half a second at workers=0 here, short against the
# host's drift), and how many blocks a side by default.
BLOCK_STEPS = 10
DEFAULT_BLOCKS = 100

SCRIPT = textwrap.dedent("""
    import sys, time
    import torch
    from torch import nn
    from torch.utils.data import DataLoader
    from torchvision import datasets
    from torchvision.transforms import v2

    ROOT, WORKERS, STEPS, SKIP, BATCH = sys.argv[1], *map(int, sys.argv[2:6])
    MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    RECIPE = v2.Compose([v2.RandomResizedCrop(128, antialias=True), v2.RandomHorizontalFlip(), v2.ToImage(),
                         v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])

    def small_cnn():
        return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
                             nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 2))

    def make_loader():
        return DataLoader(datasets.ImageFolder(ROOT, transform=RECIPE), batch_size=BATCH, shuffle=True,
                          drop_last=True, num_workers=WORKERS)

    def train_step(model, optimizer, x, y):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    if __name__ == "__main__":
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = small_cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        batches = iter(make_loader())
        wait = step = cpu = 0.0
        for n in range(1 + SKIP + STEPS):
            if n == SKIP + 1:
                cpu = time.process_time()
            t0 = time.perf_counter()
            x, y = next(batches)
            t1 = time.perf_counter()
            train_step(model, optimizer, x, y)
            t2 = time.perf_counter()
            if n > SKIP:
                wait, step = wait + t1 - t0, step + t2 - t1
        print("{tag}", wait + step, 100.0 * wait / (wait + step), time.process_time() - cpu)
""").replace("{tag}", LOOP_TAG)


@dataclass(frozen=True)
class Run:
    """One process's figures: its measured loop's seconds, starvation and main-process CPU seconds
    (every thread of it, attach's included) as the script timed them, and attach's starvation of
    the same steps (None: bare)."""

    loop_s: float
    own_starvation_pct: float
    cpu_s: float
    attach_starvation_pct: Optional[float]


def make_photo_folder(root: Path, per_class: int) -> Path:
    """An ImageFolder of JPEGs drawn by the default corpus's own picture generator
    (`synthetic_jpeg.draw_picture`): PICTURES distinct pictures, each written under many names."""
    rng = np.random.default_rng(0)
    height, width = IMAGE_HW
    pictures = [draw_picture(rng, width, height) for _ in range(PICTURES)]
    for label in CLASSES:
        (root / label).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pictures[i % PICTURES].save(root / label / f"{i}.jpg", quality=90)
    return root


def run_once(command: Sequence[str], out: Optional[Path]) -> Run:
    """Run one process; the figures the script printed, and attach's starvation when `out` is set."""
    stdout = subprocess.run(list(command), capture_output=True, text=True, check=True).stdout
    _, loop_s, own, cpu_s = next(line.split() for line in stdout.splitlines() if line.startswith(LOOP_TAG))
    attach = None
    if out is not None:
        with open(out / "summary.csv", newline="") as f:
            attach = float(next(csv.DictReader(f))["starvation_pct"])
    return Run(float(loop_s), float(own), float(cpu_s), attach)


def rounds_of(script: Path, root: Path, out: Path, workers: int, steps: int, skip: int, rounds: int
              ) -> List[Tuple[Run, Run]]:
    """Per round (bare, attached), back to back, the order alternating."""
    args = [str(root), str(workers), str(steps), str(skip), str(BATCH)]
    bare = [sys.executable, str(script), *args]
    attached = [sys.executable, "-m", "pipebench.cli.main", "attach", "--steps", str(steps), "--skip-steps",
                str(skip), "--out", str(out), "--force", "--", str(script), *args]
    pairs = []
    for round_num in range(rounds):
        if round_num % 2 == 0:
            b = run_once(bare, None)
            a = run_once(attached, out)
        else:
            a = run_once(attached, out)
            b = run_once(bare, None)
        pairs.append((b, a))
        print(f"workers={workers} round {round_num}: loop bare {b.loop_s:.3f} s, attached {a.loop_s:.3f} s "
              f"(ratio {a.loop_s / b.loop_s:.4f}), main-process CPU ratio {a.cpu_s / b.cpu_s:.4f}; "
              f"starvation: attach {a.attach_starvation_pct:.1f}%, the script's own {a.own_starvation_pct:.1f}% "
              f"(bare run {b.own_starvation_pct:.1f}%)", flush=True)
    return pairs


def table_row(workers: int, pairs: Sequence[Tuple[Run, Run]]) -> str:
    """One worker count's markdown row: medians over rounds, each against its target. The starvation
    verdict takes the worse of the two comparisons (same run, and against the bare run)."""
    ratios = [a.loop_s / b.loop_s for b, a in pairs]
    cpu = statistics.median(a.cpu_s / b.cpu_s for b, a in pairs)
    same_run = [abs(a.attach_starvation_pct - a.own_starvation_pct) for _, a in pairs]
    vs_bare = [abs(a.attach_starvation_pct - b.own_starvation_pct) for b, a in pairs]
    ratio = statistics.median(ratios)
    points = max(statistics.median(same_run), statistics.median(vs_bare))
    return (f"| {workers} | {len(pairs)} | {ratio:.4f} ({min(ratios):.3f}..{max(ratios):.3f}) | "
            f"{'PASS' if ratio <= TARGET_RATIO else 'FAIL'} | {cpu:.4f} | "
            f"{statistics.median([a.attach_starvation_pct for _, a in pairs]):.1f} | "
            f"{statistics.median(same_run):.2f} | {statistics.median(vs_bare):.2f} | "
            f"{'PASS' if points <= TARGET_POINTS else 'FAIL'} |")


def blocks_ratio(script: Path, root: Path, blocks: int) -> List[float]:
    """Watched / bare time of each pair of alternating in-process blocks at workers=0 (the module doc)."""
    sys.argv = [str(script), str(root), "0", "0", "0", str(BATCH)]
    script_globals = runpy.run_path(str(script), run_name="blocks")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = script_globals["small_cnn"]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = functools.partial(script_globals["train_step"], model, optimizer)

    def endless(loader):
        while True:
            yield from loader

    def in_order():  # the script's loader unshuffled: both sides read the same images, block for block
        return DataLoader(ImageFolder(str(root), transform=script_globals["RECIPE"]), batch_size=BATCH,
                          drop_last=True)

    bare = endless(in_order())
    watched = endless(pipebench.watch(in_order(), steps=BLOCK_STEPS * (blocks + 2), skip_steps=0,
                                      seconds=float("inf")))

    def block(batches, seed: int) -> float:
        torch.manual_seed(seed)  # the same crops and flips on both sides
        start = time.perf_counter()
        for _ in range(BLOCK_STEPS):
            step(*next(batches))
        return time.perf_counter() - start

    block(bare, 0), block(watched, 0)  # warm both
    ratios = []
    for n in range(1, blocks + 1):
        if n % 2:
            w, b = block(watched, n), block(bare, n)
        else:
            b, w = block(bare, n), block(watched, n)
        ratios.append(w / b)
    return ratios


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=list(DEFAULT_WORKERS))
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="process rounds a worker count (0: none)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--skip-steps", type=int, default=DEFAULT_SKIP)
    parser.add_argument("--blocks", type=int, default=DEFAULT_BLOCKS,
                        help="in-process alternating blocks at workers=0 (0: none)")
    args = parser.parse_args(list(argv) or None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPT)
        # Every sample of the window comes from one epoch: no restart inside it (see the module doc).
        per_class = -(-(1 + args.skip_steps + args.steps) * BATCH // len(CLASSES)) + BATCH
        root = make_photo_folder(Path(tmp) / "images", per_class)
        for workers in args.workers if args.rounds else ():
            pairs = rounds_of(script, root, Path(tmp) / f"out-{workers}", workers, args.steps, args.skip_steps,
                              args.rounds)
            rows.append(table_row(workers, pairs))
        ratios = blocks_ratio(script, root, args.blocks) if args.blocks else []
    if rows:
        print("\n| workers | rounds | attached / bare loop time (median, range) | <= 1.03 | main-process CPU, attached / bare "
              "| attach starvation % | |Δ| same run, points | |Δ| vs bare run, points | <= 3 points |\n"
              "|---|---|---|---|---|---|---|---|---|")
        print("\n".join(rows))
    if ratios:
        low, high = np.percentile(ratios, [25, 75])
        ratio = statistics.median(ratios)
        print(f"\nin one process, workers=0, {len(ratios)} alternating blocks of {BLOCK_STEPS} steps: watched / bare "
              f"{ratio:.4f} (quartiles {low:.3f}..{high:.3f}) {'PASS' if ratio <= TARGET_RATIO else 'FAIL'} (<= 1.03)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
