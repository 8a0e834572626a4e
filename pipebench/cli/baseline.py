"""The `baseline` verb: store a results folder as the baseline that nightly runs are compared with."""

import argparse
from pathlib import Path

from pipebench.record.baseline import (
    BASELINES_DIR,
    DEFAULT_BASELINE_NAME,
    update_baseline,
)

__all__ = ["add_parser", "main"]


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser("baseline", help="manage the stored baselines that nightly runs are compared with")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    update = actions.add_parser(
        "update", help="replace a stored baseline with a results folder",
        description="Copy a results folder's summary.csv, calibration.json and job-*/result.json (no traces) "
                    "into BASELINES_DIR/NAME, replacing what was there. Commit the result deliberately.",
    )
    update.add_argument("results", metavar="RESULTS_DIR", help="an invocation folder written by `pipebench run`")
    update.add_argument("--name", default=DEFAULT_BASELINE_NAME, help=f"baseline name (default: {DEFAULT_BASELINE_NAME})")
    update.add_argument("--baselines-dir", default=BASELINES_DIR, help=f"where baselines live (default: {BASELINES_DIR})")


def main(args: argparse.Namespace) -> int:
    done = update_baseline(Path(args.results), Path(args.baselines_dir), args.name)
    print(f"{'replaced' if done.replaced else 'created'} baseline {done.target} from {args.results}:")
    print("\n".join(f"  {rel}" for rel in done.files))
    print(f"commit {done.target} to make it the baseline that CI compares with")
    return 0
