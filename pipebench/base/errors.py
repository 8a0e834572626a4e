"""User-facing errors: each one becomes a single line on stderr and exit status 2."""

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
