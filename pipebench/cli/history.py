"""The `history` verb: a per-machine history of nights, one trend plot per job, its level steps."""

import argparse
import sys
from pathlib import Path

from pipebench.base.errors import ConfigError
from pipebench.model.judging import DEFAULT_THRESHOLD
from pipebench.regress.history import find_steps, load_history
from pipebench.regress.trend_plot import SIGNALS, plot_history

__all__ = ["add_parser", "main"]


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser("history", help="trend plots and level steps of a per-machine history",
                              description="Read a history CSV (pipebench ab --history), draw one trend plot per "
                                          "job and name the first commit after each level step.")
    parser.add_argument("file", metavar="HISTORY_CSV")
    parser.add_argument("--out", help="folder for the plots (default: beside the history)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help=f"smallest relative level change that counts (default: {DEFAULT_THRESHOLD})")


def main(args: argparse.Namespace) -> int:
    """Load (naming every damaged line), find steps on both signals, plot; exit 0, or 2 for no file."""
    file = Path(args.file)
    if not file.is_file():
        raise ConfigError(f"{args.file}: no such history file (pipebench ab --history writes one)")
    history = load_history(file)
    for line in history.damaged:
        print(f"pipebench: skipped {line}", file=sys.stderr)
    print(f"{len(history.rows)} rows, {len(history.jobs())} jobs from {args.file}")
    steps = [s for key, *_ in SIGNALS for s in find_steps(history, key, args.threshold)]
    for step in steps:
        print(f"step: {step.job} {step.signal} {step.before:.4g} -> {step.after:.4g} "
              f"({step.after / step.before - 1:+.1%}), first commit after it: {step.commit} ({step.date})")
    if not steps:
        print("no level step in any job")
    for plot in plot_history(history, steps, Path(args.out or file.parent)):
        print(f"plot: {plot}")
    return 0
