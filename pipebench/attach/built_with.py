"""The arguments each Dataset was constructed with, recorded while a `recording_datasets` block lasts.

For the block, the `__init__` of every Dataset subclass is wrapped: those that exist when it starts
(torch's, torchvision's, the user's imported ones: `Dataset.__subclasses__`, recursively) and those
defined inside it (a `Dataset.__init_subclass__` hook: the script's own classes). The outermost call
records its arguments beside the instance (weakly: nothing outlives the dataset), then the class's
`__init__` runs as it was. On the way out every `__init__` is put back. A dataset made before the
block has no record; the export reads its arguments back from its attributes instead.

(Not `Dataset.__new__`: once a Python `__new__` is set on a class, deleting it leaves CPython's slot
on the generic path, and `object.__new__` then refuses the constructor's arguments for good.)
"""

import contextlib
import functools
import inspect
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from torch.utils.data import Dataset

__all__ = ["BuiltWith", "recording_datasets"]

# Marks a wrapper, so a class reached twice (two parents) is wrapped once.
_WRAPPED = "_pipebench_records_arguments"


class BuiltWith:
    """id(dataset) -> (a weak reference to it, its positional and keyword arguments)."""

    def __init__(self) -> None:
        self._seen: Dict[int, Tuple[weakref.ref, tuple, dict]] = {}

    def record(self, obj: Any, args: tuple, kwargs: dict) -> None:
        key = id(obj)
        if key in self._seen and self._seen[key][0]() is obj:
            return  # the outermost __init__ came first: a parent's, called through super(), is not the build
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


def _subclasses(root: type) -> Iterator[type]:
    seen = set()
    stack = [root]
    while stack:
        cls = stack.pop()
        for sub in type.__subclasses__(cls):
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                yield sub


@contextlib.contextmanager
def recording_datasets() -> Iterator[BuiltWith]:
    """Within the block, each Dataset built is recorded with its arguments; every class is put back
    on the way out, whatever happens."""
    built = BuiltWith()
    wrapped: List[Tuple[type, Callable]] = []
    had_hook = "__init_subclass__" in Dataset.__dict__

    def wrap(cls: type) -> None:
        init = cls.__dict__.get("__init__")
        if not inspect.isfunction(init) or getattr(init, _WRAPPED, False):
            return

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            built.record(self, args, kwargs)
            init(self, *args, **kwargs)

        setattr(__init__, _WRAPPED, True)
        cls.__init__ = __init__
        wrapped.append((cls, init))

    def __init_subclass__(cls, **kwargs):
        super(Dataset, cls).__init_subclass__(**kwargs)
        wrap(cls)

    try:
        for cls in _subclasses(Dataset):
            wrap(cls)
        if not had_hook:
            Dataset.__init_subclass__ = classmethod(__init_subclass__)
        yield built
    finally:
        if not had_hook and "__init_subclass__" in Dataset.__dict__:
            del Dataset.__init_subclass__
        for cls, init in reversed(wrapped):
            cls.__init__ = init
