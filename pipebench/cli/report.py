"""The `report` verb: the comparison table, plots and report.md again from saved results, or merged."""

import argparse
from pathlib import Path

from pipebench.base.errors import ConfigError
from pipebench.cli.common_args import add_baseline_job
from pipebench.report.writer import print_summary, write_report

__all__ = ["add_parser", "main"]


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser(
        "report", help="rebuild the comparison table, plots and report.md from saved results; merge folders",
        description="Read every job-*/result.json under each DIR and write comparison.md, comparison.csv, "
                    "the PNG plots and report.md. One row per job (rounds grouped); several folders merge into "
                    "one table, with a host column when they come from different machines.",
    )
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="results folders written by `pipebench run`")
    parser.add_argument("--out", help="where to write (default: the DIR itself; required with several DIRs)")
    add_baseline_job(parser, "row, e.g. workers=0 or host=ci,workers=0", "row")
    parser.add_argument("--compare-loaders", action="store_true",
                        help="rank the loaders `pipebench attach` watched against each other (speedup, best mark, "
                             "--baseline); without it each loader of a script is described on its own")


def main(args: argparse.Namespace) -> int:
    """Several folders need --out; one folder gets its report written into it."""
    if args.out is None and len(args.dirs) > 1:
        raise ConfigError("merging several folders needs --out OUT for the merged report")
    out = Path(args.dirs[0] if args.out is None else args.out)
    print_summary(write_report(args.dirs, out, args.baseline, args.compare_loaders))
    return 0
