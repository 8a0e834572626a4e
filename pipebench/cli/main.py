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
import os
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
    exit_without_teardown,
    report_error,
    stops_unmasked,
)
from pipebench.measure.job_spawn import WAITS_UNREAPED, JobProcess, discard, start_job_process

__all__ = ["VERB_NAMES", "build_parser", "entry", "job_ahead", "main", "verbs"]

# The verbs (modules of pipebench.cli) in workflow order, so help lists them as a user meets them.
VERB_NAMES = ("attach", "dataset", "run", "explore", "tune", "storage_check", "report", "compare", "ab", "baseline",
              "history")
# The verbs that start their first job's process before they import anything heavy, so that
# process's imports (2.8 s on the 2-core machine) run beside the command's own, its config checks
# and explore's equivalence checks, none of them timed (pipebench.measure.job_spawn); the task
# function it will be handed lives in JOB_TASK_MODULE.
AHEAD_VERBS = ("run", "explore", "tune", "storage_check")
JOB_TASK_MODULE = "pipebench.sweep.job_task"
# Flags after which the verb runs no job, and overrides that send jobs to another launcher or
# interpreter: no process is started ahead for those.
NO_JOB_FLAGS = ("-h", "--help", "-c", "--cfg", "--resolve", "-i", "--info")
LAUNCHER_KEYS = ("hydra/launcher", "hydra.launcher")


def verbs(names: Sequence[str] = VERB_NAMES) -> Tuple[ModuleType, ...]:
    """The modules of the verbs named, all of them by default."""
    return tuple(importlib.import_module(f"pipebench.cli.{name}") for name in names)


def asked_verbs(argv: Sequence[str]) -> Tuple[str, ...]:
    """The verb a command line asks for (the first word that is not an option), or every verb when
    it names none or an unknown one: top-level help and argparse's error then list them all."""
    first = next((word for word in argv if not word.startswith("-")), None)
    module = _module_name(first) if first else None
    return (module,) if module in VERB_NAMES else VERB_NAMES


def _module_name(verb: str) -> str:
    """The module of a verb as typed: a hyphen in a verb's name (storage-check) is its module's underscore."""
    return verb.replace("-", "_")


def build_parser(modules: Sequence[ModuleType]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipebench",
        description="Benchmark PyTorch data-input pipelines: per-transform profiles, throughput, starvation.",
    )
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in modules:
        verb.add_parser(subparsers)
    return parser


def job_ahead(words: Sequence[str]) -> Optional[JobProcess]:
    """The first job's process, started now when the command line is one of AHEAD_VERBS that will
    launch jobs with pipebench's own launcher; None otherwise."""
    asked = asked_verbs(words)
    if len(asked) != 1 or asked[0] not in AHEAD_VERBS or not WAITS_UNREAPED:
        return None
    if any(word.split("=", 1)[0] in NO_JOB_FLAGS or any(key in word for key in LAUNCHER_KEYS) for word in words):
        return None
    return start_job_process(sys.executable, os.getpid(), JOB_TASK_MODULE)


def _terminate(signum: int, frame) -> None:
    raise Terminated()


def main(argv: Optional[Sequence[str]] = None) -> int:
    previous = signal.signal(signal.SIGTERM, _terminate)
    ahead = None
    try:
        with stops_unmasked():
            words = list(sys.argv[1:] if argv is None else argv)
            ahead = job_ahead(words)
            modules = verbs(asked_verbs(words))
            args = build_parser(modules).parse_args(words)
            args.job_ahead = ahead
            verb = next(v for v in modules if v.__name__.rsplit(".", 1)[-1] == _module_name(args.verb))
            return verb.main(args)
    except (PipebenchError, OSError) as exc:
        report_error(error_line(exc))
        return USAGE_EXIT_STATUS
    except KeyboardInterrupt:
        print("\npipebench: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_STATUS
    except Terminated:
        print("\npipebench: terminated (SIGTERM)", file=sys.stderr)
        return TERMINATED_EXIT_STATUS
    finally:
        discard(ahead)
        signal.signal(signal.SIGTERM, previous)


def entry() -> None:
    """The `pipebench` console script: `main`, then an exit that skips the modules' teardown."""
    exit_without_teardown(main())


if __name__ == "__main__":
    entry()
