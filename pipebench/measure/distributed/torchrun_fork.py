"""torchrun's launcher run in a fork of the process that launches it, not in a fresh interpreter.

`python -m torch.distributed.run` spends 1.6-3 s importing torch before it starts any rank (the
2-core VM), on every multi-rank job and every storage-check round. The job that launches the ranks
has imported torch already, and so has `pipebench attach -- torchrun`, so a fork runs torchrun's
own `main` at once. The fork is what the interpreter was: in a session of its own, tied to its
parent (pipebench.base.lifeline), with the output it is given (the job's ranks.log, attach's
terminal), and the signal handlers a fresh interpreter starts with. The ranks are still fresh
interpreters, as torchrun starts them.
"""

import os
import signal
import sys
import traceback
from typing import Mapping, Optional, Sequence

import psutil

from pipebench.base.lifeline import TIED_PID_ENV, die_with_parent, parent_is

__all__ = ["fork_torchrun"]

# The handlers a fresh Python process starts with, which torchrun's agent expects: Ctrl-C raises
# KeyboardInterrupt, SIGTERM ends the process, and the job's own handlers are not the agent's.
FRESH_HANDLERS = ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL))
# stdout and stderr: torchrun's and its ranks' output goes to both.
STDOUT_FDS = (1, 2)
# An exception out of torchrun's main ends it as an uncaught one ends `python -m`: status 1.
UNCAUGHT_STATUS = 1


def fork_torchrun(args: Sequence[str], env: Mapping[str, str], output_fd: Optional[int] = None) -> psutil.Process:
    """Start `torchrun ARGS` in a fork of this process with environment `env`, writing to `output_fd`
    (this process's stdout and stderr when None). The fork is waited for as psutil waits for a child:
    `wait(timeout)` gives its exit status, or minus the signal that ended it, or raises
    psutil.TimeoutExpired."""
    from torch.distributed.run import main as torchrun  # imported before the fork: the child starts at once

    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):  # nothing of this process's printed twice
        stream.flush()
    pid = os.fork()
    if pid:
        return psutil.Process(pid)
    status = UNCAUGHT_STATUS
    try:
        os.setsid()
        die_with_parent(parent_is(parent))
        for signum, handler in FRESH_HANDLERS:
            signal.signal(signum, handler)
        os.environ.clear()
        os.environ.update(env)
        os.environ[TIED_PID_ENV] = str(os.getpid())  # the ranks' parent, for their own tie
        for fd in STDOUT_FDS if output_fd is not None else ():
            os.dup2(output_fd, fd)
        # Streams on those descriptors, as a fresh interpreter has, whatever this process's were (a
        # caller's capture, under pytest, holds what is written to it in memory the fork drops).
        sys.stdout, sys.stderr = (open(fd, "w", buffering=1, closefd=False) for fd in STDOUT_FDS)
        torchrun(list(args))
        status = 0
    except SystemExit as exc:  # torchrun's argument errors: the status `python -m` would exit with
        status = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else UNCAUGHT_STATUS
    except BaseException:  # a rank that failed: torchrun's summary, as `python -m` prints it
        traceback.print_exc()
    finally:
        # No exit handlers: they are the parent's (the job's temporary folders), copied by the fork.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
