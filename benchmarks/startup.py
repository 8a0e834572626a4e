"""`pipebench run`'s time to a finished one-job run, with its first job's process started ahead and without.

`run` starts its first job's process before its own imports, so the job's imports (Python, Hydra,
torch) run beside the command's (pipebench/measure/job_spawn.py). Without it is the same command
with `hydra.launcher.python=null` on its line, which (a launcher override) starts none and
changes nothing else. The job is as short as a job can be, so the figure is start-up: rounds
alternate the two, the order swapped every round, and the medians and their ratio are printed.

    python benchmarks/startup.py              # 4 rounds
    python benchmarks/startup.py --rounds 8
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

# A job of a few batches of small random tensors through no chain and no consumer, with no extra
# passes: what is left of its time is the processes' start-up and the report.
TINY_JOB = ("dataset=random_tensors", "dataset.shape=[3,32,32]", "dataset.length=512", "run=quick",
            "run.progress=false", "loader.batch_size=8", "consumer=none", "trace=none", "run.profile_steps=0",
            "run.warmup_steps=0", "run.min_time_s=0", "run.thread_profile=false", "transform.per_sample=[]",
            "transform.per_batch=[]")
# A launcher override: the command then starts no process ahead (pipebench.cli.main.LAUNCHER_KEYS).
WITHOUT_AHEAD = "hydra.launcher.python=null"
SIDES = ("ahead", "without")


def run_once(side: str, results: Path) -> float:
    """Seconds for one whole `pipebench run` of the tiny job; exits on a failed run."""
    pipebench = Path(sys.executable).with_name("pipebench")
    extra = [] if side == "ahead" else [WITHOUT_AHEAD]
    started = time.perf_counter()
    done = subprocess.run([str(pipebench), "run", *TINY_JOB, *extra, f"results_dir={results}"],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"startup: the {side} run failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    return seconds


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds; each runs both sides (default 4)")
    args = parser.parse_args(argv)
    times: Dict[str, List[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="pipebench-startup-") as folder:
        for round_index in range(args.rounds):
            order = SIDES if round_index % 2 == 0 else SIDES[::-1]
            for side in order:
                times[side].append(run_once(side, Path(folder) / side))
            print(f"round {round_index + 1}/{args.rounds}: " +
                  ", ".join(f"{side} {times[side][-1]:.2f} s" for side in SIDES), flush=True)
    medians = {side: statistics.median(times[side]) for side in SIDES}
    print(f"median: started ahead {medians['ahead']:.2f} s, without {medians['without']:.2f} s, "
          f"ratio {medians['ahead'] / medians['without']:.2f} ({medians['without'] - medians['ahead']:.2f} s saved)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
