"""What `pipebench attach --record` costs a realistic training script, and whether it catches a late stall.

Overhead: the realistic script of `attach_overhead.py` (an ImageFolder of JPEGs, a v2 recipe, a small
CNN trained on the CPU), run for more steps than attach's window, three ways a round, the order
rotating so drift hits all alike: bare (`python train.py`), attached (attach's window, then nothing)
and recorded (`attach --record`: the window, then the recorder for every step after it, the
per-transform timing kept on in the workers). Printed: the median over rounds of the loop-time
ratios recorded / bare and recorded / attached (the recorder's own share), against the issue's 1%.

A planted late stall: a script whose recipe has a step that turns slow (a busy spin of
`--slow-ms` a sample) once the loop has passed 60% of its steps (the main loop creates a flag
file the step looks for). Printed: the step the stall began at, the first stalled window's steps,
how many windows it took to catch (target: within 2), and the capture's slowest step and its
ms a sample against the planted cost (target: the spin's step named, within 15%).

    python benchmarks/recorder_check.py                              # 5 rounds of 600 steps; the stall
    python benchmarks/recorder_check.py --rounds 1 --steps 60 --stall-steps 200 --every-steps 10   # seconds
"""

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Dict, List, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attach_overhead import BATCH, CLASSES, LOOP_TAG, SCRIPT, make_photo_folder  # noqa: E402

# The target: the recorder adds at most 1% to the loop's time.
TARGET_RATIO = 1.01
# The planted stall: caught within 2 windows, its step named with its cost within 15%.
TARGET_WINDOWS = 2
TARGET_COST = 0.15
DEFAULT_ROUNDS = 5
# More steps than attach's window (WINDOW_STEPS), so most of the loop runs after it.
DEFAULT_STEPS = 600
WINDOW_STEPS = 100
DEFAULT_WORKERS = 2
# The planted stall's run: steps, the window, the spin.
DEFAULT_STALL_STEPS = 1000
DEFAULT_EVERY_STEPS = 25
DEFAULT_SLOW_MS = 3.0
STALL_AT = 0.6

STALL_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    FLAG, STEPS, SLOW_MS, AT = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])

    class Spin:
        \"\"\"Nothing until FLAG exists; then a busy spin of SLOW_MS a sample.\"\"\"
        def __call__(self, x):
            if os.path.exists(FLAG):
                end = time.perf_counter() + SLOW_MS / 1000
                while time.perf_counter() < end:
                    pass
            return x

    class Scale:
        def __call__(self, x):
            return x * 2

    class Data(Dataset):
        def __init__(self):
            self.transform = [Scale(), Spin()]
        def __len__(self):
            return 10 ** 6
        def __getitem__(self, i):
            x = torch.ones(16)
            for step in self.transform:
                x = step(x)
            return x

    if __name__ == "__main__":
        loader = DataLoader(Data(), batch_size=8, num_workers=2)
        for n, batch in enumerate(loader):
            if n == int(STEPS * AT):
                open(FLAG, "w").close()
                print("STALL_AT", n + 1, flush=True)  # the recorder counts steps from 1
            if n == STEPS:
                break
            time.sleep(0.004)
""")


def loop_seconds(command: Sequence[str]) -> float:
    stdout = subprocess.run(list(command), capture_output=True, text=True, check=True).stdout
    return float(next(line.split() for line in stdout.splitlines() if line.startswith(LOOP_TAG))[1])


def overhead(tmp: Path, rounds: int, steps: int, workers: int) -> None:
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    per_class = -(-(steps + 10) * BATCH // len(CLASSES)) + BATCH
    root = make_photo_folder(tmp / "images", per_class)
    args = [str(script), str(root), str(workers), str(steps), "5", str(BATCH)]
    attach = [sys.executable, "-m", "pipebench.cli.main", "attach", "--steps", str(WINDOW_STEPS), "--force"]
    commands = {"bare": [sys.executable, *args],
                "attached": [*attach, "--out", str(tmp / "attached"), "--", *args],
                "recorded": [*attach, "--record", "--out", str(tmp / "recorded"), "--", *args]}
    names = list(commands)
    times: Dict[str, List[float]] = {name: [] for name in names}
    for round_num in range(rounds):
        order = names[round_num % 3:] + names[:round_num % 3]
        for name in order:
            times[name].append(loop_seconds(commands[name]))
        print(f"round {round_num}: " + ", ".join(f"{n} {times[n][-1]:.3f} s" for n in names), flush=True)
    vs_bare = statistics.median(r / b for r, b in zip(times["recorded"], times["bare"]))
    vs_attached = statistics.median(r / a for r, a in zip(times["recorded"], times["attached"]))
    print(f"\nworkers={workers}, {steps} steps ({WINDOW_STEPS} in attach's window), {rounds} rounds: recorded / bare "
          f"{vs_bare:.4f}, recorded / attached {vs_attached:.4f} "
          f"({'PASS' if vs_attached <= TARGET_RATIO else 'FAIL'} <= {TARGET_RATIO} for the recorder's own share)")


def read(path: Path) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def planted_stall(tmp: Path, steps: int, every_steps: int, slow_ms: float) -> None:
    script = tmp / "stall.py"
    script.write_text(STALL_SCRIPT)
    out = tmp / "stall-out"
    done = subprocess.run([sys.executable, "-m", "pipebench.cli.main", "attach", "--record", "--every-steps",
                           str(every_steps), "--out", str(out), "--force", "--", str(script), str(tmp / "flag"),
                           str(steps), str(slow_ms), str(STALL_AT)], capture_output=True, text=True, check=True)
    began = int(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("STALL_AT")))
    stalled = [r for r in read(out / "series.csv") if r["stall"]]
    if not stalled:
        print(f"planted stall at step {began}: NOT caught (FAIL)")
        return
    first = stalled[0]
    windows = -(-(int(first["last_step"]) - began + 1) // every_steps)
    print(f"planted stall at step {began}: first stalled window steps {first['first_step']}-{first['last_step']} "
          f"({first['stall']}), caught in window {windows} of the stall "
          f"({'PASS' if windows <= TARGET_WINDOWS else 'FAIL'} <= {TARGET_WINDOWS})")
    if not first["capture"]:
        print("no capture kept for it (FAIL)")
        return
    rows = read(out / f"capture-{first['capture']}" / "transforms.csv")
    slowest = max(rows, key=lambda r: float(r["ms_per_sample"]))
    cost = float(slowest["ms_per_call_median"])
    error = abs(cost - slow_ms) / slow_ms
    print(f"capture-{first['capture']}: slowest step {slowest['transform']}, median {cost:.3f} ms a sample against "
          f"the planted {slow_ms:.3f} ms ({error:.1%}; "
          f"{'PASS' if slowest['transform'] == 'Spin' and error <= TARGET_COST else 'FAIL'} <= {TARGET_COST:.0%})")


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="overhead rounds (0: none)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    parser.add_argument("--stall-steps", type=int, default=DEFAULT_STALL_STEPS, help="the stall run's steps (0: none)")
    parser.add_argument("--every-steps", type=int, default=DEFAULT_EVERY_STEPS)
    parser.add_argument("--slow-ms", type=float, default=DEFAULT_SLOW_MS)
    args = parser.parse_args(list(argv) or None)
    with tempfile.TemporaryDirectory() as tmp:
        if args.rounds:
            overhead(Path(tmp), args.rounds, args.steps, args.workers)
        if args.stall_steps:
            planted_stall(Path(tmp), args.stall_steps, args.every_steps, args.slow_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
