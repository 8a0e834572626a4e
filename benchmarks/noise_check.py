"""Does one run's 95% interval say how much the next run will differ? The same job, N fresh runs.

Each run is a separate job process (`rounds=N`, as a user would repeat it), so the run-to-run
spread includes everything a rerun changes: worker start-up, page cache, the machine's load.
Per job it prints the median single-run half-width of samples/s (batch means over
whole worker cycles) beside the observed run-to-run half-width (t(0.975, N-1) x the spread of
the N rates: where a 95% interval of one run's value would have to reach), and their ratio.
Target: the ratio within 0.5-3 (issue 12: an honest interval is neither a fraction of the real
variation nor many times it). The spread that judges is robust (the MAD, scaled to an SD), as
issue 41 measured it: with the plain SD, one run of ten at +20% (a first run on a quieter
host, say) sets the half-width alone. The SD's figure is printed beside it, and the runs the
robust spread sets aside (beyond OUTLIER_SPREADS of it) are named. Beside them, the CPU other processes used
during the runs' windows (`host_other_cpu_cores`): a single window cannot see load that other
tenants hold level for seconds, so where it is high the ratio falls and only rounds measure it.

    python benchmarks/noise_check.py                          # yuv_mask_fast at workers 0 and 2, 10 runs
    python benchmarks/noise_check.py --runs 6 workers=4 transform=yuv_mask
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

from scipy import stats

from pipebench.record.jobs import job_key
from pipebench.record.results import RESULT_FILE

# Issue 12's band for median single-run half-width / run-to-run half-width.
RATIO_LOW, RATIO_HIGH = 0.5, 3.0
# A run further than this many robust SDs from the median is named as an outlier: a normal
# sample of ten puts one there about once in 370 runs.
OUTLIER_SPREADS = 3.0
DEFAULT_OVERRIDES = ["transform=yuv_mask_fast", "workers=0,2"]


def run_jobs(overrides: List[str], runs: int, folder: Path) -> Path:
    exe = Path(sys.executable).with_name("pipebench")
    args = [str(exe), "run", *overrides, f"rounds={runs}", "run.progress=false", "trace=none",
            "run.profile_steps=0", f"results_dir={folder}"]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"noise_check: the runs failed: {done.stderr.strip().splitlines()[-1:]}")
    return Path(done.stdout.strip().splitlines()[-1].removeprefix("results: "))


def _short(key: str) -> str:
    """The job's own overrides, without the settings every run of this benchmark shares."""
    shared = ("rounds=", "run.profile_steps=", "run.progress=", "trace=")
    return ",".join(part for part in key.split(",") if not part.startswith(shared)) or key


def by_job(invocation: Path) -> Dict[str, List[dict]]:
    jobs: Dict[str, List[dict]] = defaultdict(list)
    for path in sorted(invocation.glob(f"*/{RESULT_FILE}")):
        result = json.loads(path.read_text())
        jobs[_short(job_key(result["job"]))].append(result["summary"])
    return jobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh runs of each job (default 10)")
    parser.add_argument("--keep", metavar="DIR", help="keep the runs' results folder under DIR")
    parser.add_argument("overrides", nargs="*", help=f"pipebench overrides (default: {' '.join(DEFAULT_OVERRIDES)})")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        jobs = by_job(run_jobs(args.overrides or DEFAULT_OVERRIDES, args.runs, Path(args.keep or scratch)))
    print("| job | runs | samples/s (median) | single-run half-width (median) | run-to-run half-width (robust) | "
          "ratio | run-to-run half-width (SD) | ratio (SD) | other load, cores (median) | target |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
    failed = 0
    runs_text: List[str] = []
    for job, summaries in jobs.items():
        rates = [s["samples_per_s"] for s in summaries]
        half_widths = [(s["samples_per_s_ci_high"] - s["samples_per_s_ci_low"]) / 2 for s in summaries]
        t = stats.t.ppf(0.975, len(rates) - 1)
        robust_sd = stats.median_abs_deviation(rates, scale="normal")
        observed, observed_sd = t * robust_sd, t * statistics.stdev(rates)
        half_width = statistics.median(half_widths)
        ratio = half_width / observed
        ok = RATIO_LOW <= ratio <= RATIO_HIGH
        failed += not ok
        other = statistics.median(s.get("host_other_cpu_cores") or 0.0 for s in summaries)
        centre = statistics.median(rates)
        outliers = [f"{r:.0f}" for r in rates if abs(r - centre) > OUTLIER_SPREADS * robust_sd]
        runs_text.append(f"{job}: " + " ".join(f"{r:.0f}" for r in rates)
                         + (f" (outliers: {', '.join(outliers)})" if outliers else ""))
        print(f"| {job} | {len(rates)} | {centre:.1f} | {half_width:.1f} | {observed:.1f} | {ratio:.2f} | "
              f"{observed_sd:.1f} | {half_width / observed_sd:.2f} | {other:.2f} | "
              f"{'PASS' if ok else 'FAIL'} ({RATIO_LOW}-{RATIO_HIGH}) |")
    print("\nsamples/s of each run, in the order they ran:\n" + "\n".join(runs_text))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
