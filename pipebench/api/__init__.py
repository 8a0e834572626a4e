"""pipebench's Python API: run a sweep, load a results folder, compare two runs."""

from pipebench.api.calls import JobFailures, RunResults, compare, load, run

__all__ = ["JobFailures", "RunResults", "compare", "load", "run"]
