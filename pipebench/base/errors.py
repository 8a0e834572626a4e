"""User-facing errors: each one becomes a single line on stderr and exit status 2."""

import re
import sys

# Exit status for a user mistake (bad config, bad data), as argparse uses.
USAGE_EXIT_STATUS = 2


class PipebenchError(Exception):
    """A problem the user can fix; printed as one line, never as a traceback."""


class ConfigError(PipebenchError):
    """A config key is unknown, missing or holds an impossible value."""


class DatasetError(PipebenchError):
    """A dataset cannot be built: missing path, no images, unreadable corpus."""


class SampleError(PipebenchError):
    """A sample failed to load or transform and the error policy is `fail`."""


class WorkerError(PipebenchError):
    """A DataLoader worker died or stayed silent past loader.timeout_s."""


# Control characters: a file or folder name, or a value read from a damaged file, may hold a newline.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def printable(text: str) -> str:
    """`text` with control characters escaped (a newline shows as \\n), so it stays one line."""
    return CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


def warn(message: str) -> None:
    """One line on stderr about something pipebench works around (a damaged file it will not use)."""
    print(f"pipebench: {printable(message)}", file=sys.stderr, flush=True)


def error_line(exc: Exception) -> str:
    """A user-facing error as one line; an OSError (read-only folder, a file where a folder belongs)
    names its file(s) and what the system said."""
    if isinstance(exc, OSError) and exc.strerror:
        names = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name is not None)
        return printable(f"{names}: {exc.strerror}" if names else exc.strerror)
    return printable(str(exc))
