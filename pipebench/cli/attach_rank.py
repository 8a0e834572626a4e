"""One rank of `pipebench attach -- torchrun ...`: `python -m pipebench.cli.attach_rank [-m] TARGET ARGS`.

torchrun starts it in place of the user's script (pipebench.cli.attach_torchrun). It does what attach
does in-process, over the window in WINDOW_ENV, then writes what this rank measured and the script's
exit status to the rank's own folder under RANKS_DIR_ENV (pipebench.attach.watched_ranks), and exits
with that status.

SIGTERM (torchrun stopping the ranks) ends the script as `sys.exit(143)` would, so its `finally`
blocks run and what was measured is written; SIGINT raises KeyboardInterrupt as Python's own handler
does. A script that sets its own handlers keeps them. The rank dies with torchrun (PR_SET_PDEATHSIG).
"""

import os
import signal
import sys
from typing import List, Optional

from pipebench.attach.recording import recorded, recording_from_environment
from pipebench.attach.watch import watching_loaders
from pipebench.attach.watched_ranks import rank_folder, rank_window, save_rank
from pipebench.base.errors import INTERRUPTED_EXIT_STATUS, TERMINATED_EXIT_STATUS, USAGE_EXIT_STATUS, ConfigError
from pipebench.base.lifeline import TIED_PID_ENV, die_with_parent, parent_is
from pipebench.cli.attach import parse_command, run_script
from pipebench.storage.rank_info import rank_and_world

__all__ = ["main"]


class _Stop:
    """The SIGINT and SIGTERM handler: the first of them ends the script (KeyboardInterrupt, or
    sys.exit(143)); any later one, or one after the script, is ignored, so the results are written
    whole (torchrun's SIGKILL, 30 s on, still ends a rank that hangs)."""

    def __init__(self) -> None:
        self.armed = True

    def __call__(self, signum: int, frame: object) -> None:
        if self.armed:
            self.armed = False
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(TERMINATED_EXIT_STATUS)


def main(argv: Optional[List[str]] = None) -> int:
    # torchrun, a fork of attach tied to it (pipebench.measure.distributed.torchrun_fork), is this rank's parent.
    die_with_parent(parent_is(int(os.environ.get(TIED_PID_ENV, os.getppid()))))
    try:
        window = rank_window()
        kind, target, args = parse_command(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"pipebench attach: {exc}", file=sys.stderr)
        return USAGE_EXIT_STATUS
    stop = _Stop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    # attach --record: every rank appends its windows to the results folder's series.csv, its
    # captures in its own folder.
    folder, recording = recording_from_environment() or (None, None)
    with watching_loaders(window) as watches, \
            recorded(watches, folder, recording, rank_and_world()[0], rank_folder() if recording else None):
        try:
            status = run_script(kind, target, args)
            stop.armed = False
        # The signal came while run_script was ending (printing the script's traceback: a peer's
        # failure is often seen before torchrun's signal).
        except SystemExit:
            status = TERMINATED_EXIT_STATUS
        except KeyboardInterrupt:
            status = INTERRUPTED_EXIT_STATUS
    save_rank(watches, status)
    return status


if __name__ == "__main__":
    sys.exit(main())
