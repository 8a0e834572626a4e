"""The catalogue datasets' check of an integer setting: in range, or one line naming the key."""

from __future__ import annotations

from typing import Optional

from pipebench.base.errors import DatasetError


def require_int(dataset: str, name: str, value, minimum: int, maximum: Optional[int] = None) -> int:
    """`value` if it is an integer from `minimum` to `maximum` (pipebench.config.limits; no bound where
    None), else a DatasetError naming `dataset` and the key."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or \
            (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise DatasetError(f"{dataset}: {name} must be an integer {bounds}, got {value!r}")
    return value
