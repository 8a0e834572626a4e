"""The `pipebench` command as another program runs and reads it: its module, and the line naming a
run's results folder, which the Python API and the A/B session read back from a child's output."""

from pathlib import Path
from typing import Optional, Sequence, Union

__all__ = ["CLI_MODULE", "results_folder", "results_line"]

# The command's module, run with an interpreter (`python -m`): the console script's own entry.
CLI_MODULE = "pipebench.cli.main"
# What starts the line a verb ends with, naming its results folder; a parser of it reads this text.
RESULTS_PREFIX = "results: "


def results_line(folder: Union[str, Path]) -> str:
    """The line naming a results folder."""
    return f"{RESULTS_PREFIX}{folder}"


def results_folder(lines: Sequence[str]) -> Optional[Path]:
    """The folder the last results line of a command's output names; None when no line does."""
    return next((Path(line[len(RESULTS_PREFIX):]) for line in reversed(lines) if line.startswith(RESULTS_PREFIX)),
                None)
