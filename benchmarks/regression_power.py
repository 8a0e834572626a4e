"""How often the nightly cries wolf, and how often it catches a real regression: measured.

N trials each of A/A, +10% and +20% (or the `--scenarios` named) on the real `yuv_mask_fast`
chain at workers=0,2 (or `--workers`). The slowdown is in code: a repository made in a temporary
folder holds the chain config (unchanged between commits) and a user transform appended to the
chain that makes the chain a set share dearer: it runs the chain's own steps once more, on a
photo of its own, for that share of the samples (`--injection chain`, the default). A busy host
slows that work exactly as it slows the chain, so the chain is that share dearer in any load,
as with real added code. Extra work of another kind is not: passes of a tensor product,
calibrated to 15% on one idle thread, read +18-24% per reference ms in the loop (tried
2026-11-28). The old `--injection cpu-time` burns thread CPU time to a deadline, a cost no
contention can stretch, so it reads smaller than its share under load. Commit 0 adds nothing;
the A/A, +10%, +15% and +20% commits add that share (the A/A commit differs only in a comment).
Every run has calibrate=true, so it carries the CPU reference, as the nightly's do.

Both modes:
- `ab`: `pipebench ab BASE HEAD`, both commits in one session, rounds paired;
- `stored`: a stored run of the base commit, then each scenario's head run compared with it. With
  `--baseline per-trial` (the default) each trial stores its own, just before its heads, so the
  trials are independent; `--baseline once` stores one for all, as a nightly does, and then every
  trial shares that baseline's own error (measured 2026-11-28: four A/A trials against one
  baseline read 0.94-0.99, all below 1), so the rates found hold for that baseline only.

Per job, signal and mode it prints the false-alarm rate (A/A called `slower` or `faster`; per job,
and per night = any job), the power (each +N% called `slower`) and the share called `noisy`, each
with its Wilson 95% interval. The signals: throughput; CPU time as compare judges it (per ms of the
CPU reference, both sides carrying it); the raw CPU time a sample, judged by the same compare on
the same runs with the reference taken out (what compare did before the reference); the job's
verdict.

In `stored` mode a fourth scenario, `A/A+hog`, runs the A/A commit with a CPU hog beside the head
run (issue 41: under a hog the process's CPU time a sample rose 11%, between the 10% threshold and
a real regression's). Its false alarms are the busy-host column: a signal that separates a busy
host from a dearer chain keeps it near zero while still catching +15%. Not in `ab` mode: its
rounds interleave, so a hog would sit beside both sides alike.

    python benchmarks/regression_power.py                 # N=20, 5 rounds: hours on a 2-core machine
    python benchmarks/regression_power.py --quick         # N=1, 4 rounds, short jobs, workers=0 only
    python benchmarks/regression_power.py --trials 1 --rounds 4 --modes ab
    # issue 41's busy-host case: a hog beside the same code against a 15% dearer chain
    python benchmarks/regression_power.py --modes stored --workers 2 --scenarios A/A+hog +15%
"""

import argparse
import csv
import dataclasses
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Tuple

from scipy.stats import binomtest

from pipebench.config.compose import compose_job_spec
from pipebench.pipeline.build import build_dataset, build_transforms
from pipebench.regress.compare import Run, compare_runs, load_run

PIPEBENCH = [sys.executable, "-c", "import sys; from pipebench.cli.main import main; sys.exit(main())"]
# Each scenario's commit and the share of the chain's CPU time its user transform burns.
SHARES = {"A/A": 0.0, "+10%": 0.10, "+15%": 0.15, "+20%": 0.20}
# The A/A commit measured with a CPU hog beside the head run (stored mode only: see the docstring).
HOG = "A/A+hog"
# Those that change nothing: any `slower` or `faster` there is a false alarm.
UNCHANGED = ("A/A", HOG)
DEFAULT_SCENARIOS = ("A/A", "+10%", "+20%", HOG)
# One spinning process, in a session of its own (the kernel's autogroup would otherwise share it
# with the benchmark's session as one): a tenant that takes one core of the host, as issue 41's hog did.
HOG_PROCESSES = 1
SIGNALS = (("throughput", "wall_verdict"), ("CPU time", "cpu_verdict"), ("job", "verdict"))
# compare's CPU verdict on the same runs with the CPU reference taken out of both sides.
RAW_CPU = "CPU time raw"
# The nightly's own settings (calibrate=true: the CPU reference rides in every run); --quick
# shortens each job.
JOB = ["dataset=synthetic_jpeg", "dataset.num_images=16", "dataset.length=2048", "consumer=emulated",
       "transform=power_chain", "trace=none", "run.progress=false", "run.profile_steps=0", "run.repeats=1",
       "calibrate=true"]
DEFAULT_WORKERS = "0,2"
FULL_RUN = ["run.warmup_steps=3", "run.steps=15", "run.min_time_s=2.0"]
# One worker count: measured here, one trial of both modes at workers=0,2 took 565 s for A/A alone
# (each side of each round starts the CLI, ~12 s, besides its jobs), so all three scenarios ran
# past 25 minutes; at workers=0 alone the three took 791 s (2026-11-23), inside the 15 asked for.
QUICK_WORKERS = "0"
QUICK_RUN = ["run.warmup_steps=1", "run.steps=6", "run.min_time_s=0.5"]
CHAIN = """per_sample:
  - _target_: torchvision.transforms.PILToTensor
  - _target_: torchvision.transforms.RandomCrop
    size: 256
  - _target_: pipebench.transforms.mask.FastRandomMask
    ratio: 0.25
  - _target_: pipebench.transforms.color.ConvertColor
  - _target_: pipebench.transforms.color.Scale
  - _target_: power_user.Extra
per_batch: []
"""
EXTRA_CPU_TIME = """import time

EXTRA_MS = {ms!r}  # {label}


class Extra:
    \"\"\"The injected slowdown: EXTRA_MS of this thread's CPU time a sample.\"\"\"

    def __call__(self, sample):
        deadline = time.thread_time_ns() + int(EXTRA_MS * 1e6)
        while time.thread_time_ns() < deadline:
            pass
        return sample
"""
EXTRA_CHAIN = """from pipebench.measure.cpu_reference import run_workload, seed_chain, synthetic_jpeg

SHARE = {share!r}  # {label}
# A photo of the chain's corpus that neither the dataset's first images nor the CPU reference use.
PHOTO_SEED = 1000


class Extra:
    \"\"\"The injected slowdown: the chain's own steps once more for SHARE of the samples.\"\"\"

    def __init__(self):
        self.photo, self.chain, self.owed = synthetic_jpeg(PHOTO_SEED), seed_chain(), 0.0

    def __call__(self, sample):
        self.owed += SHARE
        while self.owed >= 1.0:
            self.owed -= 1.0
            run_workload(self.photo, self.chain)
        return sample
"""
INJECTIONS = ("chain", "cpu-time")
# Samples timed to learn the chain's CPU cost a sample.
COST_SAMPLES = 40


def chain_cpu_ms() -> float:
    """The yuv_mask_fast chain's median thread CPU ms a sample here, one thread."""
    import torch
    torch.set_num_threads(1)
    spec = compose_job_spec(["transform=yuv_mask_fast", "dataset=synthetic_jpeg", "dataset.num_images=16"])
    dataset = build_dataset(spec)
    chain = build_transforms(spec.per_sample, "transform.per_sample")
    costs = []
    for i in range(COST_SAMPLES):
        sample = dataset[i][0]  # (lazy image, label): the decode is part of the chain
        start = time.thread_time_ns()
        for transform in chain:
            sample = transform(sample)
        costs.append((time.thread_time_ns() - start) / 1e6)
    return sorted(costs)[len(costs) // 2]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def make_repo(root: Path, cost_ms: float, injection: str) -> Dict[str, str]:
    """The user repository: commit `base`, then one commit a scenario; returns scenario -> commit."""
    repo = root / "repo"
    (repo / "conf" / "transform").mkdir(parents=True)
    (repo / "conf" / "transform" / "power_chain.yaml").write_text(CHAIN)
    (repo / ".gitignore").write_text("results/\n")
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "bench@example.com")
    git(repo, "config", "user.name", "bench")
    commits = {}
    for label, share in (("base", 0.0), *SHARES.items()):
        extra = (EXTRA_CHAIN.format(share=share, label=label) if injection == "chain"
                 else EXTRA_CPU_TIME.format(ms=share * cost_ms, label=label))
        (repo / "power_user.py").write_text(extra)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", label)
        commits[label] = git(repo, "rev-parse", "HEAD")
        git(repo, "reset", "-q", "--hard", commits["base"])
    return commits


def verdicts(compare_csv: Path) -> Dict[Tuple[str, str], str]:
    """(job, signal) -> verdict from a compare.csv."""
    rows = list(csv.DictReader(compare_csv.open()))
    return {(row["job"], name): row[column] for row in rows for name, column in SIGNALS}


def without_reference(run: Run) -> Run:
    """The run as compare saw it before the CPU reference."""
    return dataclasses.replace(run, jobs={label: dataclasses.replace(job, reference_cpu_ms=())
                                          for label, job in run.jobs.items()})


def raw_cpu_verdicts(baseline: Path, current: Path) -> Dict[Tuple[str, str], str]:
    """(job, RAW_CPU) -> compare's CPU verdict on raw CPU time a sample, same runs."""
    comparison = compare_runs(without_reference(load_run(str(baseline))), without_reference(load_run(str(current))))
    return {(job.job, RAW_CPU): job.cpu_verdict for job in comparison.jobs}


def ab_trial(repo: Path, base: str, head: str, rounds: int, run: Sequence[str], results: Path) -> Dict:
    proc = subprocess.run([*PIPEBENCH, "ab", "--config-dir", "conf", "--rounds", str(rounds), "--results-dir",
                           str(results), base, head, *JOB, *run], cwd=repo, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"ab failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    folder = Path(proc.stdout.strip().splitlines()[-1].rsplit("results: ", 1)[1])
    return verdicts(folder / "compare.csv")


def stored_run(repo: Path, commit: str, rounds: int, run: Sequence[str], results: Path) -> Path:
    git(repo, "checkout", "-q", "--detach", commit)
    proc = subprocess.run([*PIPEBENCH, "run", "--fresh", "--config-dir", "conf", *JOB, *run, f"rounds={rounds}",
                           f"results_dir={results}"], cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"run failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return Path(proc.stdout.strip().splitlines()[-1][len("results: "):])


@contextmanager
def hogged(on: bool) -> Iterator[None]:
    """HOG_PROCESSES CPU spinners for the length of the block, when `on`."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(HOG_PROCESSES if on else 0)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def stored_trial(repo: Path, baseline: Path, head: str, rounds: int, run: Sequence[str], results: Path,
                 hog: bool = False) -> Dict:
    with hogged(hog):
        folder = stored_run(repo, head, rounds, run, results)
    subprocess.run([*PIPEBENCH, "compare", "--out", str(folder), str(baseline), str(folder)], capture_output=True,
                   text=True)
    return {**verdicts(folder / "compare.csv"), **raw_cpu_verdicts(baseline, folder)}


def wilson(k: int, n: int) -> str:
    if n == 0:
        return "n/a"
    ci = binomtest(k, n).proportion_ci(method="wilson")
    return f"{k}/{n} = {k / n:.0%} [{ci.low:.0%}, {ci.high:.0%}]"


def report(outcomes: Dict[Tuple[str, str], List[Dict]], scenarios: Sequence[str]) -> str:
    """The markdown table: a row per mode, job and signal, a column per scenario."""
    def heading(label: str) -> str:
        return f"{label}: false alarms" if label in UNCHANGED else f"{label} called slower"
    lines = ["| mode | job | signal | " + " | ".join(heading(label) for label in scenarios) + " | noisy (all) |",
             "|---|---|---|" + "---|" * (len(scenarios) + 1)]
    for mode in sorted({m for m, _ in outcomes}):
        keys = sorted({k for label in scenarios for trial in outcomes.get((mode, label), []) for k in trial})
        for job, signal in keys:
            def cell(label: str) -> str:
                trials = outcomes.get((mode, label), [])
                wanted = ("slower", "faster") if label in UNCHANGED else ("slower",)
                return wilson(sum(t.get((job, signal)) in wanted for t in trials), len(trials))
            all_trials = [t for label in scenarios for t in outcomes.get((mode, label), [])]
            noisy = sum(t.get((job, signal)) == "noisy" for t in all_trials)
            lines.append(f"| {mode} | `{job}` | {signal} | " + " | ".join(cell(label) for label in scenarios)
                         + f" | {wilson(noisy, len(all_trials))} |")
        aa = outcomes.get((mode, "A/A"), [])
        if aa:
            per_night = [any(v in ("slower", "faster") for (j, s), v in t.items() if s == "job") for t in aa]
            lines.append(f"| {mode} | every job (per night) | job | A/A: {wilson(sum(per_night), len(per_night))} |"
                         + " |" * len(scenarios))
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, help="trials a scenario (default 20; --quick 1)")
    parser.add_argument("--rounds", type=int, help="rounds a side (default 5; --quick 4)")
    parser.add_argument("--quick", action="store_true",
                        help="1 trial, 4 rounds, short jobs at workers=0: the protocol end to end, not a power estimate")
    parser.add_argument("--modes", nargs="+", default=["ab", "stored"], choices=["ab", "stored"])
    parser.add_argument("--scenarios", nargs="+", default=list(DEFAULT_SCENARIOS), choices=[*SHARES, HOG],
                        # argparse %-formats help: the scenarios' own % signs are doubled.
                        help=f"which commits to measure against the base (default: "
                             f"{' '.join(DEFAULT_SCENARIOS).replace('%', '%%')}); {HOG} runs in stored mode only")
    parser.add_argument("--workers",
                        help=f"the sweep's worker counts (default {DEFAULT_WORKERS}; --quick {QUICK_WORKERS})")
    parser.add_argument("--baseline", choices=("per-trial", "once"), default="per-trial",
                        help="stored mode: a baseline run for each trial (independent trials) or one for all")
    parser.add_argument("--injection", choices=INJECTIONS, default="chain",
                        help="the slowdown: the chain's own work again (a busy host slows it) or a CPU-time burn (not)")
    args = parser.parse_args(argv or None)
    trials = args.trials or (1 if args.quick else 20)
    rounds = args.rounds or (4 if args.quick else 5)
    workers = args.workers or (QUICK_WORKERS if args.quick else DEFAULT_WORKERS)
    run = [f"workers={workers}", *(QUICK_RUN if args.quick else FULL_RUN)]
    start = time.monotonic()
    cost = chain_cpu_ms()
    injected = ", ".join(f"{label} = {SHARES[label] * cost:.2f} ms" for label in args.scenarios if SHARES.get(label))
    print(f"yuv_mask_fast: {cost:.2f} CPU ms a sample; {injected or 'nothing'} injected as {args.injection}; "
          f"{trials} trials, {rounds} rounds, workers={workers}, modes {args.modes}, baseline {args.baseline}",
          flush=True)
    outcomes: Dict[Tuple[str, str], List[Dict]] = {}
    with tempfile.TemporaryDirectory(prefix="pipebench-power-") as tmp:
        root = Path(tmp)
        commits = make_repo(root, cost, args.injection)
        repo, results = root / "repo", root / "results"
        baseline = None
        for trial in range(trials):
            if "stored" in args.modes and (baseline is None or args.baseline == "per-trial"):
                baseline = stored_run(repo, commits["base"], rounds, run, results)
            for label in args.scenarios:
                head = commits["A/A" if label == HOG else label]
                if "ab" in args.modes and label != HOG:
                    outcomes.setdefault(("ab", label), []).append(ab_trial(repo, commits["base"], head, rounds, run,
                                                                           results))
                if baseline is not None:
                    outcomes.setdefault(("stored", label), []).append(
                        stored_trial(repo, baseline, head, rounds, run, results, hog=label == HOG))
                called = {f"{mode} {job} {signal}": verdict for (mode, scenario), runs in outcomes.items()
                          if scenario == label for (job, signal), verdict in runs[-1].items()}
                print(f"trial {trial + 1}/{trials} {label}: {time.monotonic() - start:.0f} s {called}", flush=True)
            # The table so far after each trial: a run cut short keeps what it measured.
            print(report(outcomes, args.scenarios), flush=True)
    print(f"took {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
