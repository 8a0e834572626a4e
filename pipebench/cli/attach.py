"""The `attach` verb: run the user's own training script, unchanged, and measure every DataLoader it iterates.

The script runs in this interpreter (`runpy`), with its own argv, while `watching_loaders`
patches torch's DataLoader; its exit status comes back as attach's, its traceback is printed
as Python prints it, and what was measured before it ended is written all the same.
"""

import argparse
import gc
import importlib.util
import os
import runpy
import sys
import time
import traceback
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence

from pipebench.attach.claimed_folder import claimed_folder
from pipebench.attach.export_config import write_exports
from pipebench.attach.export_pipeline import with_measured_step
from pipebench.attach.recording import Recording, recorded
from pipebench.attach.script_end import (hang_shows_itself, own_loaders, script_namespaces, stop_workers,
                                         without_handler, workers_end_quietly)
from pipebench.attach.watch import DEFAULT_REPLAY, DEFAULT_SECONDS, DEFAULT_SKIP_STEPS, DEFAULT_STEPS, WatchWindow, watching_loaders
from pipebench.attach.watched import results_of, save_results, summary_line
from pipebench.base.command import results_line
from pipebench.base.errors import INTERRUPTED_EXIT_STATUS, TERMINATED_EXIT_STATUS, USAGE_EXIT_STATUS, ConfigError, Terminated
from pipebench.base.tables import markdown_table
from pipebench.cli.attach_record import add_record_args, recording_of
from pipebench.cli.attach_python import (CODE_FILE, PYTHON_NAMES, TARGET_OPTIONS, path_entry, python_flags, rerun,
                                         rerun_argv, run_code, split_python)
from pipebench.cli.attach_torchrun import attach_torchrun, parse_torchrun, torchrun_args
from pipebench.report.summary import first_batch_markdown, loader_notes
from pipebench.report.writer import REPORT_MD, write_report

__all__ = ["ScriptCommand", "add_parser", "main", "run_script"]

# The exit status Python gives a script that ends in an uncaught exception.
UNCAUGHT_EXIT_STATUS = 1
# Where a run's folder goes when --out does not say: one folder a run, named by its start time.
DEFAULT_OUT = "results/attach"
SUMMARY_TABLE_COLUMNS = ("loader", "dataset", "workers", "steps", "samples_per_s", "batches_per_s",
                         "starvation_pct", "au_pct", "first_batch_s", "headroom_x")


class ScriptCommand(NamedTuple):
    """A script as attach runs it: its kind ('path' | 'module' | 'code'), target and arguments."""

    kind: str
    target: str
    argv: List[str]


def parse_command(words: Sequence[str]) -> ScriptCommand:
    """The `ScriptCommand` of `[python] script.py ARGS`, `[python] -m module ARGS`
    or `[python] -c code ARGS`. The interpreter's flags are refused here: `main` runs attach
    again under them (pipebench.cli.attach_python)."""
    words = list(words)
    if words[:1] == ["--"]:
        words = words[1:]
    if words and os.path.basename(words[0]) in PYTHON_NAMES:
        parsed = split_python(words[1:])
        if parsed.flags:
            raise ConfigError(f"attach runs a script under the interpreter's flags ({' '.join(parsed.flags)}) "
                              "only as the command `pipebench attach -- python FLAGS ...`")
        words = list(parsed.rest)
    if not words:
        raise ConfigError("attach needs a command: pipebench attach -- python train.py ARGS")
    if words[0] in TARGET_OPTIONS:
        if len(words) < 2:
            raise ConfigError(f"attach -- python {words[0]} needs " + ("a module name" if words[0] == "-m" else "code"))
        return ScriptCommand("module" if words[0] == "-m" else "code", words[1], words[2:])
    if words[0].startswith("-"):
        raise ConfigError(f"attach runs a script or -m module, not the interpreter option {words[0]}")
    if not Path(words[0]).is_file():
        raise ConfigError(f"no script at {words[0]}")
    return ScriptCommand("path", words[0], words[1:])


def _script_frames(tb):
    """The traceback from the script's first frame: attach's and runpy's own frames left out, and
    attach's signal handler that raised a Ctrl-C's KeyboardInterrupt."""
    # runpy may be frozen into the interpreter (3.11+), its frames then named "<frozen runpy>".
    skipped = (__file__, runpy.__file__, "<frozen runpy>", run_code.__code__.co_filename)
    while tb is not None and tb.tb_frame.f_code.co_filename in skipped:
        tb = tb.tb_next
    return without_handler(tb)


def run_script(kind: str, target: str, argv: Sequence[str], own: Optional[List[str]] = None) -> int:
    """Run the script as `python target argv...` would (`-c target argv...` for 'code'), in this
    process; its exit status. `own` gets the loader-likes of its own the script left
    (`script_end.own_loaders`)."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = ["-c" if kind == "code" else target, *argv]
    entry = path_entry(kind, target)
    if entry is not None:
        sys.path.insert(0, entry)
    try:
        script_file = {"path": target, "code": CODE_FILE}.get(kind) or (importlib.util.find_spec(target).origin or "")
    except (ImportError, AttributeError, ValueError):  # runpy says why, in the script's own words, below
        script_file = ""
    try:
        if kind == "path":
            left = runpy.run_path(target, run_name="__main__")
        elif kind == "code":
            left = run_code(target)
        else:
            left = runpy.run_module(target, run_name="__main__", alter_sys=True)
        if own is not None:
            own.extend(own_loaders(script_namespaces(left, None, script_file)))
        del left  # the script's globals, its loaders among them: the gc.collect below can now free them
        return 0
    except BaseException as exc:
        if own is not None:
            own.extend(own_loaders(script_namespaces(None, exc.__traceback__, script_file)))
        return _failed(exc, target)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        # The script's loaders and their workers go before the results are written. The workers
        # first, as the interpreter's exit ends a bare script's: a loader freed only by the collect
        # (one that keeps its own iterator, as timm's MultiEpochsDataLoader does) has its queues'
        # feeder threads closed before torch's shutdown runs, so torch waits 5 s for each worker
        # it can no longer tell to stop (issue 41.7).
        stop_workers()
        gc.collect()


def _failed(exc: BaseException, target: str) -> int:
    """The exit status of a script that raised, its traceback (or message) shown as Python shows it."""
    if isinstance(exc, SystemExit):
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return UNCAUGHT_EXIT_STATUS
    if isinstance(exc, Terminated):  # SIGTERM (cli/main.py's handler): without attach the script ends at once, silently
        print(f"pipebench attach: {target} terminated (SIGTERM); what was measured is kept", file=sys.stderr)
        return TERMINATED_EXIT_STATUS
    # The script's own failure, Ctrl-C included: shown as Python shows it.
    traceback.print_exception(type(exc), exc, _script_frames(exc.__traceback__))
    return INTERRUPTED_EXIT_STATUS if isinstance(exc, KeyboardInterrupt) else UNCAUGHT_EXIT_STATUS


def _not_measured(target: str, status: int, own: Sequence[str]) -> int:
    """attach's status when the script iterated no DataLoader, and its one line: a script that failed
    (Python has shown why) gets its own status back; one that ran to its end, the way to measure it."""
    held = (f"; it holds {', '.join(own)}, a loader of its own: measure its loop with pipebench.watch(loader) "
            f"(docs/attach.md, 'A loader of its own')" if own else "")
    if status in (INTERRUPTED_EXIT_STATUS, TERMINATED_EXIT_STATUS):  # said already: a traceback, or one line
        return status
    if status != 0:
        print(f"pipebench attach: {target} failed (it exited {status}) before it iterated a "
              f"torch.utils.data.DataLoader: nothing was measured{held}", file=sys.stderr)
        return status
    print(f"pipebench attach: {target} iterated no torch.utils.data.DataLoader (it exited 0)"
          f"{held or '; a loader of its own class is measured with pipebench.watch(loader) in the script'}",
          file=sys.stderr)
    return USAGE_EXIT_STATUS


def _attach_script(script: ScriptCommand, window: WatchWindow, folder: Path, export_dir: Optional[str],
                   recording: Optional[Recording]) -> int:
    """Run the script with its loaders watched (and recorded, pipebench.attach.recording); write what
    they measured to `folder`, claimed."""
    kind, target, argv = script
    own: List[str] = []
    with watching_loaders(window, export=export_dir is not None) as watches, \
            recorded(watches, folder, recording), workers_end_quietly():
        status = run_script(kind, target, argv, own)
    stop_workers()  # no worker outlives attach, nor waits for it to write
    if not any(w.iterated for w in watches):
        return _not_measured(target, status, own)
    if export_dir is not None:
        exports = [(w.site, with_measured_step(w.exported, w.passes)) for w in watches
                   if w.iterated and w.exported is not None]
        print("\n".join(write_exports(export_dir, exports)))
    results = results_of(watches)
    if not results:
        print(f"pipebench attach: no step measured: every loader stopped within its {window.skip_steps} "
              f"warm-up steps (lower --skip-steps); the script exited {status}", file=sys.stderr)
        return status or USAGE_EXIT_STATUS
    save_results(folder, results)
    print(markdown_table([summary_line(r) for r in results], SUMMARY_TABLE_COLUMNS))
    named = [{**r.record.summary.row, "job": r.name} for r in results]  # each loader as the table names it
    print(first_batch_markdown(named))
    for note in loader_notes(named):
        print(note)
    write_report([str(folder)], folder)  # report.md, as run writes it: each loader described on its own
    print(f"report: {folder / REPORT_MD}")
    print(f"{results_line(folder)}  (pipebench report {folder})")
    return status


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser(
        "attach", help="run your own training script unchanged and measure every DataLoader it iterates",
        description="Run `python train.py ARGS` (or `python -m module ARGS`) in this interpreter with "
                    "torch's DataLoader watched: per loader, the wait in next() against the step between "
                    "next() calls over a bounded window, samples/s, starvation and the first batch. "
                    "The script's exit status is attach's.",
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"steps measured a loader (default {DEFAULT_STEPS})")
    parser.add_argument("--skip-steps", type=int, default=DEFAULT_SKIP_STEPS,
                        help=f"warm-up steps after the first batch, not measured (default {DEFAULT_SKIP_STEPS})")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS,
                        help=f"the window's longest time (default {DEFAULT_SECONDS:g} s)")
    parser.add_argument("--replay", type=int, default=DEFAULT_REPLAY, metavar="N",
                        help="after the window, feed N kept batches again to the step: its time with the loader "
                             "out of the way, and the headroom (off by default: the extra steps train the model "
                             "on repeated batches; see docs/attach.md)")
    parser.add_argument("--export-config", metavar="DIR",
                        help="also write each loader's dataset/, transform/ and loader/ configs into DIR, for "
                             "pipebench run / explore --config-dir DIR (what cannot be written is named)")
    parser.add_argument("--out", help=f"the results folder (default {DEFAULT_OUT}/<time>); one that holds "
                                      "results is refused, unless --force")
    parser.add_argument("--force", action="store_true",
                        help="replace the results already in --out (an earlier run's): removed before the "
                             "script starts")
    add_record_args(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- python train.py ARGS, -- python -m module ARGS, or -- torchrun [OPTIONS] train.py ARGS")


def main(args: argparse.Namespace) -> int:
    """Run the command with its loaders watched and write what they measured to --out (a new folder
    under DEFAULT_OUT when none), claimed before the script starts (claimed_folder: --force replaces
    an earlier run there)."""
    try:
        window = WatchWindow(args.steps, args.skip_steps, args.seconds, args.replay)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    command, out, export_dir, recording = args.command, args.out, args.export_config, recording_of(args)
    flagged = python_flags(command)
    if flagged is not None:  # the interpreter's flags act at its start: attach runs again under them
        rerun(rerun_argv(sys.argv[1:], command, *flagged))
    torchrun = torchrun_args(command)
    if torchrun is not None:  # every rank watched (pipebench.cli.attach_torchrun)
        if export_dir is not None:
            raise ConfigError("--export-config reads one process's loaders: export from the script run by "
                              "python (one rank), then sweep distributed.nproc= under pipebench run")
        parsed = parse_torchrun(torchrun)
    else:
        script = parse_command(command)
        if export_dir is not None and Path(export_dir).exists() and not Path(export_dir).is_dir():
            raise ConfigError(f"--export-config {export_dir}: not a directory")
    # A new folder's name when --out does not say (claimed_folder adds -2, -3, ... when it is taken).
    fresh = Path(DEFAULT_OUT) / time.strftime("%Y-%m-%d_%H-%M-%S")
    with claimed_folder(None if out is None else Path(out), fresh, args.force) as folder:
        if torchrun is not None:
            return attach_torchrun(parsed, window, folder, recording)
        with hang_shows_itself():
            return _attach_script(script, window, folder, export_dir, recording)
