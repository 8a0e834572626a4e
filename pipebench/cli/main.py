"""The `pipebench` command: one module per verb, listed in workflow order.

Each verb module has `add_parser(verbs)` and `main(args) -> int`; argparse stays here, at the
edge, and a user error anywhere below, or a file-system error (a read-only results folder, a file
where a folder belongs), becomes one line and exit status 2.
"""

import argparse
import sys
from typing import Optional, Sequence

from pipebench.base.errors import USAGE_EXIT_STATUS, PipebenchError, error_line
from pipebench.cli import baseline, compare, explore, report, run

__all__ = ["VERBS", "build_parser", "main"]

# Workflow order: help lists the verbs as a user meets them.
VERBS = (run, explore, report, compare, baseline)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipebench",
        description="Benchmark PyTorch data-input pipelines: per-transform profiles, throughput, starvation.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in VERBS:
        verb.add_parser(verbs)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    verb = next(v for v in VERBS if v.__name__.rsplit(".", 1)[-1] == args.verb)
    try:
        return verb.main(args)
    except (PipebenchError, OSError) as exc:
        print(f"pipebench: error: {error_line(exc)}", file=sys.stderr)
        return USAGE_EXIT_STATUS


if __name__ == "__main__":
    sys.exit(main())
