"""The round gate: one `pipebench run` of many rounds that starts each round only when told to.

An A/B session (pipebench.regress.ab) measures two trees round by round, alternating. Started once
with `rounds=N`, each side pays a command's fixed costs (imports, the build check, the calibration,
the report) once, not once a round. The launcher asks its gate before the first job of each round,
so only one side measures at a time. The session hands the pipes over in GATE_ENV; a run without it
never waits. The module is torch-free, so a session can ask a side's tree whether it has one
(`python -c "import pipebench.measure.round_gate"`).
"""

import os
from dataclasses import dataclass
from typing import Mapping, MutableMapping, Optional

from pipebench.base.errors import PipebenchError
from pipebench.measure.job_spawn import read_number

__all__ = ["GATE_ENV", "RoundGate", "gate_env", "gate_from_environ", "read_number", "say_round"]

# "READ_FD,WRITE_FD": the descriptors a run reads its go-ahead on and says it is ready on.
GATE_ENV = "PIPEBENCH_ROUND_GATE"


def say_round(fd: int, round_num: int) -> None:
    """One line, the round's number: from a run, "ready for it"; from its session, "go on with it"."""
    os.write(fd, f"{round_num}\n".encode())


@dataclass(frozen=True)
class RoundGate:
    """A run's side of the gate: the descriptor its go-ahead comes on and the one it says it is ready on."""

    read_fd: int
    write_fd: int

    def enter(self, round_num: int) -> None:
        """Say this run is ready for `round_num` and wait until it may start it. A session that
        ended instead (its pipe closed) ends the run with one line: no side measures unpaced."""
        try:
            say_round(self.write_fd, round_num)
            told = read_number(self.read_fd)
        except BrokenPipeError:
            told = None
        if told != round_num:
            raise PipebenchError("the A/B session pacing this run's rounds has ended")


def gate_from_environ(environ: MutableMapping[str, str]) -> Optional[RoundGate]:
    """The gate GATE_ENV names, taken out of `environ` (the job processes this run starts inherit
    neither the variable nor the descriptors, which are not inheritable), or None."""
    value = environ.pop(GATE_ENV, None)
    if not value:
        return None
    read_fd, write_fd = (int(fd) for fd in value.split(","))
    for fd in (read_fd, write_fd):
        os.set_inheritable(fd, False)
    return RoundGate(read_fd, write_fd)


def gate_env(env: Mapping[str, str], read_fd: int, write_fd: int) -> dict:
    """`env` with GATE_ENV naming the descriptors a run reads its go-ahead on and says it is ready on."""
    return {**env, GATE_ENV: f"{read_fd},{write_fd}"}
