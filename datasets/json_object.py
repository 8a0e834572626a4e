"""A JSON object a format stores (LitData's and MDS's index.json, the corpus manifest) read once into
a frozen type by the type's own field names, so no reader picks it apart key by key.

The catalogues rank below record/ (docs/layout.md), so they read their files with this, not with
`pipebench.record.sections.parse`.
"""

from dataclasses import MISSING, fields
from typing import Any, Type, TypeVar

__all__ = ["from_json"]

T = TypeVar("T")


def from_json(cls: Type[T], data: Any) -> T:
    """`cls` from a JSON object: each field from its own key, its default where the object has none, and
    keys the type does not name left out. TypeError where `data` is no object, KeyError naming the
    first field with no default that it lacks."""
    if not isinstance(data, dict):
        raise TypeError(f"{type(data).__name__}, not an object")
    declared = fields(cls)  # type: ignore[arg-type]
    for f in declared:
        if f.name not in data and f.default is MISSING and f.default_factory is MISSING:
            raise KeyError(f.name)
    return cls(**{f.name: data[f.name] for f in declared if f.name in data})
