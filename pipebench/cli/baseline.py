"""The `baseline` verb: store a results folder as the baseline that nightly runs are compared with,
one folder per machine (BASELINES_DIR/<machine>/NAME), and find this machine's."""

import argparse
import sys
from pathlib import Path

from pipebench.measure.fingerprint import machine_folder, machine_key
from pipebench.record.baseline import (
    BASELINES_DIR,
    DEFAULT_BASELINE_NAME,
    update_baseline,
)
from pipebench.record.results import SUMMARY_CSV, load_job_results

__all__ = ["add_parser", "main"]

# `baseline which` exits with this when this machine has no baseline yet: the nightly records one.
EXIT_NO_BASELINE = 3


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser("baseline", help="manage the stored baselines that nightly runs are compared with")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    update = actions.add_parser(
        "update", help="replace a stored baseline with a results folder",
        description="Copy a results folder's summary.csv, calibration.json and job-*/result.json (no traces) "
                    "into BASELINES_DIR/<machine>/NAME, replacing what was there; <machine> is the CPU model and "
                    "usable cores the results were measured on. Commit the result deliberately.",
    )
    update.add_argument("results", metavar="RESULTS_DIR", help="an invocation folder written by `pipebench run`")
    which = actions.add_parser(
        "which", help="print this machine's baseline folder; exit 3 (and say so) when it has none",
        description="A stored baseline is only ever compared on the machine it was measured on.")
    for action in (update, which):
        action.add_argument("--name", default=DEFAULT_BASELINE_NAME,
                            help=f"baseline name (default: {DEFAULT_BASELINE_NAME})")
        action.add_argument("--baselines-dir", default=BASELINES_DIR,
                            help=f"where the machines' folders live (default: {BASELINES_DIR})")


def main(args: argparse.Namespace) -> int:
    if args.action == "which":
        target = Path(args.baselines_dir) / machine_key() / args.name
        if not (target / SUMMARY_CSV).is_file():
            print(f"no baseline for this machine ({machine_key()}) in {target}", file=sys.stderr)
            return EXIT_NO_BASELINE
        print(target)
        return 0
    results = Path(args.results)
    jobs = load_job_results(results) if results.is_dir() else []
    machine = machine_folder(jobs[0].fingerprint) if jobs else machine_key()
    done = update_baseline(results, Path(args.baselines_dir) / machine, args.name)
    print(f"{'replaced' if done.replaced else 'created'} baseline {done.target} from {args.results}:")
    print("\n".join(f"  {rel}" for rel in done.files))
    print(f"commit {done.target} to make it the baseline that CI compares with on this machine")
    return 0
