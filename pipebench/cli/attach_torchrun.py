"""`pipebench attach -- torchrun [OPTIONS] train.py ARGS`: every rank's script watched, the ranks' results merged.

`torchrun ...` and `python -m torch.distributed.run ...` are rewritten, torchrun's own options kept, so
each rank runs the script under pipebench's watch (pipebench.cli.attach_rank):

    torchrun OPTIONS -m pipebench.cli.attach_rank [-m] TARGET ARGS

torchrun runs in a fork of this process, in a session of its own and tied to it
(pipebench.measure.distributed.torchrun_fork), its output on the terminal; the SIGINT and
SIGTERM sent to attach go to it, and it hands them to the ranks as from a terminal. Its exit status is
attach's, and what it started that is still alive is ended on the way out (pipebench.base.descendants).
The ranks' folders are then merged into one results folder: a row a rank, and the straggler figures.
"""

import os
import signal
import sys
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import List, NoReturn, Optional, Sequence, Tuple

from pipebench.attach.recording import Recording, recording_environment, start_files
from pipebench.attach.sinks.sink_set import open_sinks
from pipebench.attach.watch import WatchWindow
from pipebench.attach.watched import WatchedLoader
from pipebench.attach.watched_ranks import RANKS_FOLDER, merge_ranks, rank_environment, rank_status
from pipebench.base.command import results_line
from pipebench.base.descendants import no_descendant_outlives
from pipebench.base.errors import USAGE_EXIT_STATUS, ConfigError
from pipebench.base.tables import markdown_table
from pipebench.measure.distributed.multirank import aggregate_line
from pipebench.measure.distributed.rank_result import RankSections
from pipebench.measure.distributed.torchrun_fork import fork_torchrun

__all__ = ["TorchrunCommand", "attach_torchrun", "parse_torchrun", "torchrun_args"]

TORCHRUN = "torchrun"
TORCHRUN_MODULE = "torch.distributed.run"
# What torchrun runs on each rank in place of the user's script.
RANK_MODULE = "pipebench.cli.attach_rank"
# torchrun's flag for "the script is a module": moved after the rank module, to the user's target.
MODULE_FLAGS = ("-m", "--module")
# The signals a user sends to stop a run; the rest keep their default (SIGKILL can't be caught:
# the lifeline takes torchrun down then).
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
RANK_TABLE_COLUMNS = ("rank", "samples_per_s", "starvation_pct", "au_pct", "wait_ms_median", "busy_ms_mean",
                      "collective_ms_mean", "steps")


@dataclass(frozen=True)
class TorchrunCommand:
    """A torchrun command taken apart: torchrun's options (its module flag left out), whether the
    target is a module, the target and its arguments."""

    options: Tuple[str, ...]
    module: bool
    target: str
    args: Tuple[str, ...]

    def rank_args(self) -> List[str]:
        """torchrun's arguments for the same launch, each rank running the target under pipebench's watch."""
        return [*self.options, "-m", RANK_MODULE, *(("-m",) if self.module else ()), self.target, *self.args]


def torchrun_args(command: Sequence[str]) -> Optional[List[str]]:
    """torchrun's own arguments when `command` launches torchrun (`torchrun ...` or
    `python -m torch.distributed.run ...`), else None."""
    words = list(command)
    if words[:1] == ["--"]:
        words = words[1:]
    if words and os.path.basename(words[0]) == TORCHRUN:
        return words[1:]
    if len(words) >= 3 and os.path.basename(words[0]).startswith("python") and words[1:3] == ["-m", TORCHRUN_MODULE]:
        return words[3:]
    return None


def _refuse(message: str) -> NoReturn:
    raise ConfigError(f"attach -- torchrun: {message}")


def parse_torchrun(words: Sequence[str]) -> TorchrunCommand:
    """torchrun's arguments read by torchrun's own parser. Raises ConfigError on what attach cannot run."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.error = _refuse  # one line, not argparse's usage and exit
    args = parser.parse_args(list(words))
    if args.no_python or args.run_path:
        _refuse("--no-python and --run-path are not supported: attach starts each rank as `python -m "
                f"{RANK_MODULE}`, which then runs the script")
    cut = len(words) - len(args.training_script_args) - 1
    if not args.module and not Path(args.training_script).is_file():
        _refuse(f"no script at {args.training_script}")
    return TorchrunCommand(tuple(w for w in words[:cut] if w not in MODULE_FLAGS), bool(args.module),
                           args.training_script, tuple(args.training_script_args))


def run_torchrun(command: TorchrunCommand, env: dict) -> int:
    """torchrun to its end, SIGINT and SIGTERM sent to this process forwarded to its session, nothing
    it started left alive; its exit status."""
    with no_descendant_outlives():
        proc = fork_torchrun(command.rank_args(), env)

        def forward(signum: int, frame: object) -> None:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)

        saved = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
        try:
            return int(proc.wait())
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)


def attach_torchrun(command: TorchrunCommand, window: WatchWindow, folder: Path,
                    recording: Optional[Recording]) -> int:
    """Run torchrun's `command` with every rank watched (and recorded: each rank appends to the
    folder's series.csv); merge the ranks into `folder`, which the caller has claimed, empty
    (pipebench.attach.claimed_folder)."""
    ranks_dir = folder / RANKS_FOLDER
    if recording is not None:
        # A sink that cannot start is one line and exit 2 before torchrun starts (each rank starts its own).
        open_sinks(recording.sinks).close()
        start_files(folder)
    status = run_torchrun(command, {**os.environ, **rank_environment(ranks_dir, window),
                                    **recording_environment(recording, folder)})
    ranks = rank_status(ranks_dir) if ranks_dir.is_dir() else []
    if not ranks:
        print(f"pipebench attach: no rank of {command.target} wrote its results (torchrun exited {status})",
              file=sys.stderr)
        return status or USAGE_EXIT_STATUS
    if not any(r.iterated for r in ranks):
        print(f"pipebench attach: no rank of {command.target} iterated a torch.utils.data.DataLoader (torchrun "
              f"exited {status}); a loader of its own class is measured with pipebench.watch(loader)", file=sys.stderr)
        return USAGE_EXIT_STATUS
    merged = merge_ranks(ranks_dir, folder)
    if not merged:
        print(f"pipebench attach: no rank measured a step past its {window.skip_steps} warm-up steps "
              f"(torchrun exited {status}); the ranks' folders are in {ranks_dir}", file=sys.stderr)
        return status or USAGE_EXIT_STATUS
    for record in merged:
        loader, rows = WatchedLoader.of(record), RankSections.of(record).ranks
        print(f"loader {loader.site} ({loader.dataset_class}), {len(rows)} ranks:")
        print(markdown_table(rows, RANK_TABLE_COLUMNS))
        print(f"{aggregate_line(record.summary.row)}, AU {record.summary.au_pct:.1f}% (the least rank's)")
    print(f"each rank's own results: {ranks_dir}")
    print(f"{results_line(folder)}  (pipebench report {folder})")
    return status
