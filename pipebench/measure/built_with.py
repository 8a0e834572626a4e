"""The arguments each Dataset was constructed with, recorded while a `recording_datasets` block lasts.

`torch.utils.data.Dataset.__new__` is replaced for the block: every Dataset subclass that does not
define its own `__new__` (torch's, torchvision's and the user's alike, defined before the block or
inside it) passes its constructor's arguments through it, so they are kept beside the instance
(weakly: nothing outlives the dataset) without wrapping any class's `__init__`. A dataset made
before the block has no record; the export reads its arguments back from its attributes instead.
"""

import contextlib
import inspect
import weakref
from typing import Any, Dict, Iterator, Optional, Tuple

from torch.utils.data import Dataset

__all__ = ["BuiltWith", "recording_datasets"]


class BuiltWith:
    """id(dataset) -> (a weak reference to it, its positional and keyword arguments)."""

    def __init__(self) -> None:
        self._seen: Dict[int, Tuple[weakref.ref, tuple, dict]] = {}

    def record(self, obj: Any, args: tuple, kwargs: dict) -> None:
        key = id(obj)
        try:
            ref = weakref.ref(obj, lambda _, key=key: self._seen.pop(key, None))
        except TypeError:  # a class with __slots__ and no __weakref__: not recorded
            return
        self._seen[key] = (ref, args, dict(kwargs))

    def arguments(self, obj: Any) -> Optional[Dict[str, Any]]:
        """The arguments `obj` was built with, by parameter name (those given, not the defaults), or
        None when it was not built inside the block or they do not bind to its `__init__`."""
        seen = self._seen.get(id(obj))
        if seen is None or seen[0]() is not obj:
            return None
        _, args, kwargs = seen
        try:
            bound = inspect.signature(type(obj).__init__).bind(obj, *args, **kwargs)
        except (TypeError, ValueError):
            return None
        named = dict(list(bound.arguments.items())[1:])
        for name, parameter in inspect.signature(type(obj).__init__).parameters.items():
            if parameter.kind is parameter.VAR_KEYWORD and name in named:
                named.update(named.pop(name))
            elif parameter.kind is parameter.VAR_POSITIONAL and name in named:
                return None  # *args have no names a config can give
        return named


@contextlib.contextmanager
def recording_datasets() -> Iterator[BuiltWith]:
    """Within the block, each Dataset built is recorded with its arguments; `Dataset.__new__` is put
    back on the way out, whatever happens."""
    built = BuiltWith()
    had = "__new__" in Dataset.__dict__
    original = Dataset.__dict__.get("__new__")

    def __new__(cls, *args, **kwargs):
        obj = original.__get__(None, cls)(cls) if had else object.__new__(cls)
        if args or kwargs:
            built.record(obj, args, kwargs)
        return obj

    Dataset.__new__ = __new__
    try:
        yield built
    finally:
        if had:
            Dataset.__new__ = original
        else:
            del Dataset.__new__
