"""The `pipebench` command: one module per verb, listed in workflow order.

Each verb module has `add_parser(verbs)` and `main(args) -> int`; argparse stays here, at the
edge, and a user error anywhere below, or a file-system error (a read-only results folder, a file
where a folder belongs), becomes one line and exit status 2. Stopping it is one line too, at any
moment: Ctrl-C exits 130 and SIGTERM 143. So that this holds while the verbs import torch and
Hydra (seconds), they are imported inside `main`, and this module imports nothing heavy. Only the
verb asked for is imported: `pipebench compare` never pays for the torch that `run` needs.
"""

import argparse
import importlib
import signal
import sys
from types import ModuleType
from typing import Optional, Sequence, Tuple

from pipebench.base.errors import (
    INTERRUPTED_EXIT_STATUS,
    TERMINATED_EXIT_STATUS,
    USAGE_EXIT_STATUS,
    PipebenchError,
    Terminated,
    error_line,
)

__all__ = ["VERB_NAMES", "build_parser", "main", "verbs"]

# The verbs (modules of pipebench.cli) in workflow order, so help lists them as a user meets them.
VERB_NAMES = ("attach", "run", "explore", "report", "compare", "ab", "baseline", "history")


def verbs(names: Sequence[str] = VERB_NAMES) -> Tuple[ModuleType, ...]:
    """The modules of the verbs named, all of them by default."""
    return tuple(importlib.import_module(f"pipebench.cli.{name}") for name in names)


def asked_verbs(argv: Sequence[str]) -> Tuple[str, ...]:
    """The verb a command line asks for (the first word that is not an option), or every verb when
    it names none or an unknown one: top-level help and argparse's error then list them all."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return (first,) if first in VERB_NAMES else VERB_NAMES


def build_parser(modules: Sequence[ModuleType]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipebench",
        description="Benchmark PyTorch data-input pipelines: per-transform profiles, throughput, starvation.",
    )
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in modules:
        verb.add_parser(subparsers)
    return parser


def _terminate(signum: int, frame) -> None:
    raise Terminated()


def main(argv: Optional[Sequence[str]] = None) -> int:
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        words = list(sys.argv[1:] if argv is None else argv)
        modules = verbs(asked_verbs(words))
        args = build_parser(modules).parse_args(words)
        verb = next(v for v in modules if v.__name__.rsplit(".", 1)[-1] == args.verb)
        return verb.main(args)
    except (PipebenchError, OSError) as exc:
        print(f"pipebench: error: {error_line(exc)}", file=sys.stderr)
        return USAGE_EXIT_STATUS
    except KeyboardInterrupt:
        print("\npipebench: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_STATUS
    except Terminated:
        print("\npipebench: terminated (SIGTERM)", file=sys.stderr)
        return TERMINATED_EXIT_STATUS
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
