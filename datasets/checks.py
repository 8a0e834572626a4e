"""The catalogue datasets' check of an integer setting: in range, or one line naming the key."""

from __future__ import annotations

from pipebench.base.errors import DatasetError


def require_int(dataset: str, name: str, value, minimum: int, maximum: int) -> int:
    """`value` if it is an integer from `minimum` to `maximum` (pipebench.config.limits), else a
    DatasetError naming `dataset` and the key."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise DatasetError(f"{dataset}: {name} must be an integer in [{minimum}, {maximum}], got {value!r}")
    return value
