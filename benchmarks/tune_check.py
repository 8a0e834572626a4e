"""`pipebench tune` on planted cases of known answer, and against the full grid of the same space.

Issue 39's targets, each a command a user types:
- a step that sleeps, releasing the GIL (`Sleep`): many workers win, past the core count;
- a pure-Python step that holds the GIL (`BusyWait`): worker processes (loader.backend=dataloader) at
  about the core count win, and the probe's thread profile keeps threads out of the race;
each found within --budget-s (five minutes by default) on this machine, with `tune.search=race` (the
default), Optuna's sampler (`--search optuna`, needs optuna) or both;
- with --grid: the seed chain's full grid of the same space as one `pipebench run` sweep, and the
  tuner's pick read from it: within the grid winner's interval, at no more than a quarter of the
  grid's wall time.

    python benchmarks/tune_check.py                          # the planted cases, 5-minute budgets
    python benchmarks/tune_check.py --search both --grid     # both searches, and the grid on yuv_mask
    python benchmarks/tune_check.py --grid-only              # the grid alone
    python benchmarks/tune_check.py --quick                  # a check that it works: one short stage each
"""

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Mapping, Sequence, Tuple

from pipebench.base.cores import usable_cores
from pipebench.report.comparison import measured_rate

PIPEBENCH = str(Path(sys.executable).with_name("pipebench"))
# The budget for each planted case on this machine.
BUDGET_S = 300.0
# A step's cost in the planted chains: long enough that the loader's own bookkeeping (~0.05 ms a
# sample) is noise beside it, short enough that a round of short jobs measures thousands of samples.
SLEEP_MS = 5.0
BUSY_MS = 2.0
# The grid's target: the tuner at no more than this share of the grid's wall time.
GRID_TIME_SHARE = 0.25
DATASET = ["dataset=random_tensors", "dataset.shape=[3,32,32]", "dataset.length=4096", "loader.batch_size=32",
           "consumer=none", "run.progress=false"]
CHAINS = {
    "sleepy": f"per_sample:\n  - _target_: pipebench.transforms.synthetic.Sleep\n    ms: {SLEEP_MS}\nper_batch: []\n",
    "busy": f"per_sample:\n  - _target_: pipebench.transforms.synthetic.BusyWait\n    ms: {BUSY_MS}\nper_batch: []\n",
}
QUICK = ["run=quick", "run.min_time_s=0.5", "tune.stages=1", "tune.rounds=1", "tune.verify_rounds=0",
         "tune.prefetch_factors=[2]", "tune.persistent_workers=[false]"]


def pipebench(args: Sequence[str], cwd: Path) -> Tuple[str, float]:
    """Run `pipebench ARGS` as a user would: its stdout and wall seconds, or exit with its error."""
    started = time.perf_counter()
    done = subprocess.run([PIPEBENCH, *args], capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        sys.exit(f"pipebench {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    for line in done.stderr.splitlines():  # a failed job's line: the point left the race for it
        if line.startswith("pipebench: error"):
            print(line, flush=True)
    return done.stdout, time.perf_counter() - started


def results_folder(stdout: str, cwd: Path) -> Path:
    return cwd / stdout.strip().splitlines()[-1].removeprefix("results: ")


def _rows(path: Path) -> List[Dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def recommended(folder: Path) -> Dict[str, str]:
    """The recommended row of a tune's tune.csv."""
    return next(r for r in _rows(folder / "tune.csv") if r["verdict"].startswith("recommended"))


def why(folder: Path) -> str:
    """What tune.md says of how its race ended: where it stopped, and the points it left unresolved."""
    lines = (folder / "tune.md").read_text().splitlines()
    return " ".join(line.removeprefix("- ") for line in lines if line.startswith(("- stopped:", "not resolved:")))


def _check_sleepy(pick: Mapping[str, str], cores: int) -> Tuple[bool, str]:
    workers = int(pick["workers"])
    return workers > cores, f"many workers: workers={workers} against {cores} usable cores"


def _check_busy(pick: Mapping[str, str], cores: int) -> Tuple[bool, str]:
    workers, backend = int(pick["workers"]), pick["loader.backend"]
    near = cores / 2 <= workers <= 2 * cores
    return backend == "dataloader" and near, f"processes at about the cores: {backend}, workers={workers}, {cores} cores"


CHECKS = {"sleepy": _check_sleepy, "busy": _check_busy}


def planted(work: Path, search: str, budget_s: float, quick: bool, cores: int) -> List[Dict[str, object]]:
    """Each planted chain tuned once; a row per case with the pick and whether it is the known answer."""
    rows = []
    for chain, check in CHECKS.items():
        # Sleep scales past the cores: give the sleeper room to show it (the busy chain's model drops these).
        ladder = [0, 1, 2, 4, 2 * cores, 4 * cores] if chain == "sleepy" else None
        args = ["tune", "--config-dir", "conf", "--budget-s", f"{budget_s:g}", f"transform={chain}", *DATASET,
                f"tune.search={search}", f"results_dir={work / 'runs'}",
                *([f"tune.workers=[{','.join(str(w) for w in sorted(set(ladder)))}]"] if ladder else []),
                *(QUICK if quick else [])]
        stdout, wall = pipebench(args, work)
        folder = results_folder(stdout, work)
        pick = recommended(folder)
        passed, says = check(pick, cores)
        rows.append({"case": chain, "search": search, "budget_s": budget_s, "wall_s": round(wall), "pick": pick["point"],
                     "samples_per_s": round(float(pick["samples_per_s"])), "expected": says,
                     "result": "pass" if passed and wall <= budget_s + 60 else "FAIL", "race": why(folder)})
        print(rows[-1], flush=True)
    return rows


def grid(work: Path, budget_s: float, quick: bool) -> Dict[str, object]:
    """The seed chain tuned, then its full grid run as one sweep; the pick's rate read from the grid."""
    space = ["tune.variants=false", "tune.workers=[0,1,2,4]", "tune.prefetch_factors=[2,4]",
             "tune.persistent_workers=[false,true]"]
    common = ["transform=yuv_mask", "dataset.num_images=16", "consumer=none", "run.progress=false",
              f"results_dir={work / 'runs'}"]
    stdout, tune_wall = pipebench(["tune", "--budget-s", f"{budget_s:g}", *common, *space,
                                   *(QUICK[:2] if quick else [])], work)
    pick = recommended(results_folder(stdout, work))
    rounds = 1 if quick else 4
    stdout, grid_wall = pipebench(["run", "--fresh", *common, "workers=0,1,2,4", "loader.backend=dataloader,threads,spdl",
                                   "loader.prefetch_factor=2,4", "loader.persistent_workers=false,true",
                                   "loader.pin_memory=false", "trace=none", f"rounds={rounds}",
                                   *(QUICK[:2] if quick else ["run.steps=10", "run.min_time_s=1"])], work)
    row = judge_grid(pick, results_folder(stdout, work), tune_wall, grid_wall)
    print(row, flush=True)
    return row


def judge_grid(pick: Mapping[str, str], grid_folder: Path, tune_wall: float, grid_wall: float) -> Dict[str, object]:
    """The grid's row: the tuner's pick read from the grid's summary, against the grid winner's interval
    and the time target."""
    rounds_of: Dict[Tuple[str, ...], List[Dict[str, str]]] = {}
    for row in _rows(grid_folder / "summary.csv"):
        config = row["job"]
        key = tuple(sorted(p for p in config.split(",") if not p.startswith(("run.round", "results_dir"))))
        rounds_of.setdefault(key, []).append(row)
    # Each grid point's rate and interval as the comparison table gives them: one round's 95% CI, the
    # IQR of several.
    spreads = {k: measured_rate([{"summary": r} for r in rows]) for k, rows in rounds_of.items()}
    best_key = max(spreads, key=lambda k: spreads[k].value)
    best = spreads[best_key]
    # Lower-cased on both sides: a flag reads `True` in tune.csv and in Hydra's job name, `true` as an
    # override, and a match must not hang on which.
    wanted = {part.lower() for part in (f"workers={pick['workers']}", f"loader.backend={pick['loader.backend']}",
                                        f"loader.prefetch_factor={pick['loader.prefetch_factor']}",
                                        f"loader.persistent_workers={pick['loader.persistent_workers']}")}
    picked = next((spreads[k].value for k in spreads if wanted <= {part.lower() for part in k}), float("nan"))
    share = tune_wall / grid_wall
    row = {"case": "grid", "pick": pick["point"], "pick_in_grid": f"{picked:.0f}", "grid_best": ",".join(best_key),
           "grid_best_samples_per_s": round(best.value), "grid_best_interval": f"{best.low:.0f} to {best.high:.0f}",
           "interval": best.kind, "tune_wall_s": round(tune_wall), "grid_wall_s": round(grid_wall),
           "time_share": round(share, 2), "time_share_target": GRID_TIME_SHARE,
           "result": "pass" if best.low <= picked and share <= GRID_TIME_SHARE else "FAIL"}
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--search", choices=("race", "optuna", "both"), default="race")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    parser.add_argument("--grid", action="store_true", help="also the seed chain's full grid (an hour or more here)")
    parser.add_argument("--grid-only", action="store_true", help="the grid without the planted cases")
    parser.add_argument("--quick", action="store_true", help="one short stage a case, no verification: that it runs")
    parser.add_argument("--work", type=Path, default=Path("results/tune_check"))
    args = parser.parse_args()
    args.work = args.work.resolve()
    conf = args.work / "conf" / "transform"
    conf.mkdir(parents=True, exist_ok=True)
    for name, text in CHAINS.items():
        (conf / f"{name}.yaml").write_text(text)
    cores = usable_cores()
    searches = ("race", "optuna") if args.search == "both" else (args.search,)
    rows = [] if args.grid_only else [row for search in searches
                                      for row in planted(args.work, search, args.budget_s, args.quick, cores)]
    if args.grid or args.grid_only:
        rows.append(grid(args.work, args.budget_s, args.quick))
    failed = [r for r in rows if r["result"] != "pass"]
    print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
