"""A stored JSON object read once into a frozen type by the type's own field names.

Every room reads its stored shapes through this one function (result.json's sections, LitData's and MDS's
index.json, the corpus manifest, PEP 610's direct_url.json, a capture's record), so no reader picks a
mapping apart key by key, and a misspelt field is an AttributeError, not a silent `.get` default.
"""

from dataclasses import MISSING, Field, fields
from functools import lru_cache
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Type, TypeVar

__all__ = ["EXTRA", "MissingFields", "parse", "parse_all", "required_fields"]

T = TypeVar("T")
# The field that keeps an object's keys its type does not declare (where the type has one).
EXTRA = "extra"


class MissingFields(KeyError, ValueError):
    """A stored object lacks a field its type requires (one with no default)."""

    def __str__(self) -> str:
        return str(self.args[0])


@lru_cache(maxsize=None)
def _declared(cls: type) -> Dict[str, Field]:
    # Read once a type: a GPU trace parses thousands of events of one type.
    return {f.name: f for f in fields(cls)}


def required_fields(cls: type) -> Tuple[str, ...]:
    """The fields of `cls` that have no default: what every stored object of it must hold."""
    return tuple(name for name, f in _declared(cls).items()
                 if name != EXTRA and f.default is MISSING and f.default_factory is MISSING)


def parse(cls: Type[T], data: Optional[Mapping[str, Any]]) -> T:
    """`cls` from a stored object: each declared field from its own key (a JSON list as a tuple), its
    default where the object has none (an older writer), the other keys in `extra` where the type keeps
    one and dropped where it does not. None reads as an empty object. TypeError where `data` is no
    object, `MissingFields` naming every required field it lacks."""
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise TypeError(f"{type(data).__name__}, not an object")
    declared = _declared(cls)
    known = {name: tuple(value) if isinstance(value, list) else value
             for name, value in data.items() if name in declared and name != EXTRA}
    missing = [name for name in required_fields(cls) if name not in known]
    if missing:
        raise MissingFields(f"{cls.__name__} lacks {', '.join(missing)}")
    if EXTRA in declared:
        known[EXTRA] = {name: value for name, value in data.items() if name not in declared}
    return cls(**known)


def parse_all(cls: Type[T], rows: Optional[Sequence[Mapping[str, Any]]]) -> Tuple[T, ...]:
    """`parse` over a stored list of objects."""
    return tuple(parse(cls, row) for row in rows or ())
