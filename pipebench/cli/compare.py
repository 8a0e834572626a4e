"""The `compare` verb: two results folders, one verdict per job; exit 0, 1 (a `slower`) or 2."""

import argparse
from typing import Optional

from pipebench.base.errors import PipebenchError, error_line, report_error
from pipebench.regress.compare import (
    DEFAULT_THRESHOLD,
    EXIT_INCOMPARABLE,
    EXIT_OK,
    EXIT_REGRESSION,
    SLOWER,
    checked_comparison,
    load_run,
    render_markdown,
    write_comparison,
)

__all__ = ["add_parser", "compare_main", "main"]


def compare_main(baseline: str, current: str, threshold: float = DEFAULT_THRESHOLD,
                 allow_mismatch: bool = False, out_dir: Optional[str] = None) -> int:
    """Print markdown, optionally write it and CSV; exit 0, 1 (a `slower`) or 2."""
    try:
        comparison = checked_comparison(load_run(baseline), load_run(current), threshold, allow_mismatch)
        if out_dir is not None:
            write_comparison(comparison, out_dir)
    except (PipebenchError, OSError) as exc:
        report_error(error_line(exc))
        return EXIT_INCOMPARABLE
    print(render_markdown(comparison), end="")
    return EXIT_REGRESSION if comparison.counts()[SLOWER] else EXIT_OK


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser(
        "compare", help="compare two results folders; exit 1 on a regression, 2 if they cannot be compared",
        description="Per job: the ratio of samples/s (current / baseline) with a bootstrap interval over the "
                    "repeats and rounds, a t-test on the logs (Holm-corrected over the jobs), the change in "
                    "starvation and a verdict on throughput and on CPU time a sample. A regression must be "
                    "significant AND larger than --threshold. Ratios are also normalised "
                    "by the calibration workload when both folders have calibration.json.",
    )
    parser.add_argument("baseline", metavar="BASELINE", help="a results folder (or its summary.csv)")
    parser.add_argument("current", metavar="CURRENT", help="a results folder (or its summary.csv)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help=f"smallest relative change that counts (default: {DEFAULT_THRESHOLD})")
    parser.add_argument("--allow-mismatch", action="store_true",
                        help="compare even when torch, CPU, cores, dataset or config differ (the output says so)")
    parser.add_argument("--out", help="also write compare.md and compare.csv into this folder")


def main(args: argparse.Namespace) -> int:
    return compare_main(args.baseline, args.current, args.threshold, args.allow_mismatch, args.out)
