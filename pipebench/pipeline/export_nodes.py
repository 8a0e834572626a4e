"""A live object written back as a `_target_` node that builds an equal one, or the reason it cannot be.

Shared by `recipe` (a recipe object opened into one node a step) and the export of a watched loader
(`pipebench attach --export-config`): an object's constructor arguments are read back from its
attributes of the same name (`inspect.signature`), and the object rebuilt from them must equal the
original (the same repr, or the same attributes where its class has no repr of its own); an argument
held as None where the constructor defaults to something else is tried at its default. A function
is written by its importable name. What has no importable name (a lambda, a function or class
defined inside a function, anything defined in the script run as `__main__`) cannot be.
"""

import enum
import importlib
import inspect
import pathlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch

from pipebench.pipeline.instantiate import instantiate_node

__all__ = ["GET_OBJECT", "NodeOrWhy", "attribute_arguments", "importable_why", "object_node", "plain_node",
           "plain_value", "public_target", "value_node"]

# torchvision's public namespaces: a step is written under the one that exports its class.
PUBLIC_NAMESPACES = ("torchvision.transforms.v2", "torchvision.transforms")
# The node that instantiates to an object by its dotted name (a function, a dtype), not a call of it.
GET_OBJECT = "hydra.utils.get_object"
# How deep `value_node` follows objects held by objects (a Compose inside a RandomApply): a bound,
# not a limit real recipes reach, so a cyclic object ends with a reason rather than a RecursionError.
MAX_DEPTH = 8
_LIST_AS_TUPLE = str.maketrans("[]", "()")


@dataclass(frozen=True)
class NodeOrWhy:
    """A config value that instantiates back to the object, or why there is none (`why` non-empty)."""

    node: Any = None
    why: str = ""

    @property
    def ok(self) -> bool:
        return not self.why


def public_target(cls: type) -> str:
    """`torchvision.transforms.v2.RandomCrop` rather than its private module; else module.qualname."""
    for namespace in PUBLIC_NAMESPACES:
        if cls.__module__.startswith(namespace):
            if getattr(importlib.import_module(namespace), cls.__name__, None) is cls:
                return f"{namespace}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def plain_value(value: Any) -> Tuple[bool, Any]:
    """(True, a config value that instantiates back to `value`) for plain values (numbers, strings,
    enums, dtypes and lists of them), else (False, None)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True, value
    if isinstance(value, enum.Enum):
        return True, {"_target_": public_target(type(value)), "_args_": [value.value]}
    if isinstance(value, torch.dtype):
        return True, {"_target_": GET_OBJECT, "path": str(value)}
    if isinstance(value, (list, tuple)):
        items = [plain_value(v) for v in value]
        return all(ok for ok, _ in items), [v for _, v in items]
    return False, None


def _where_defined(code_owner: Any) -> str:
    code = getattr(code_owner, "__code__", None)
    return f" at {pathlib.Path(code.co_filename).name}:{code.co_firstlineno}" if code is not None else ""


def importable_why(owner: Any) -> str:
    """Why a function or class has no name a job process can import it by ("" when it has one)."""
    name = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
    module = getattr(owner, "__module__", None)
    if getattr(owner, "__name__", "") == "<lambda>":
        return f"a lambda{_where_defined(owner)}: it has no name to import it by"
    if "<locals>" in name:
        return f"{name.replace('.<locals>', '')} is defined inside a function{_where_defined(owner)}, so it has no " \
               "importable name (a closure's captured state cannot be written either)"
    if module in (None, "__main__"):
        return f"{name} is defined in the script run as __main__, which a pipebench job cannot import: " \
               "move it to a module"
    try:
        found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return f"{module}.{name} cannot be imported by that name"
    return "" if found is owner else f"{module}.{name} imports as another object"


def attribute_arguments(obj: Any) -> Tuple[Optional[Dict[str, Any]], str]:
    """(the object's constructor arguments as its attributes of the same name hold them, "") or
    (None, why not): a required one not kept so, or a signature that cannot be read."""
    try:
        parameters = list(inspect.signature(type(obj).__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None, "its constructor's signature cannot be read"
    arguments = {}
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if hasattr(obj, parameter.name):
            arguments[parameter.name] = getattr(obj, parameter.name)
        elif parameter.default is parameter.empty:
            return None, f"its argument `{parameter.name}` is not kept as an attribute of that name"
    return arguments, ""


def plain_node(value: Any) -> NodeOrWhy:
    """`plain_value` as a NodeOrWhy: objects are refused."""
    ok, node = plain_value(value)
    return NodeOrWhy(node) if ok else NodeOrWhy(why=f"a {type(value).__name__}, not a plain value")


def _same_object(rebuilt: Any, obj: Any) -> bool:
    """The same repr where the class has its own (a list read back where the object holds a tuple,
    size=[224, 224], counting as equal); else the same attributes."""
    if type(obj).__repr__ is not object.__repr__:
        return repr(rebuilt).translate(_LIST_AS_TUPLE) == repr(obj).translate(_LIST_AS_TUPLE)
    try:
        return type(rebuilt) is type(obj) and bool(vars(rebuilt) == vars(obj))
    except Exception:  # attributes that do not compare (arrays): not shown to be the same
        return False


def object_node(obj: Any, value: Callable[[Any], NodeOrWhy] = plain_node) -> NodeOrWhy:
    """A node of the object's class and its arguments (each through `value`), checked by rebuilding it."""
    function = inspect.isfunction(obj) or inspect.isbuiltin(obj)
    why = importable_why(obj if function else type(obj))
    if why:
        return NodeOrWhy(why=why)
    if function:
        return NodeOrWhy({"_target_": GET_OBJECT, "path": f"{obj.__module__}.{obj.__qualname__}"})
    raw, why = attribute_arguments(obj)
    if raw is None:
        return NodeOrWhy(why=why)
    arguments = {}
    for name, held in raw.items():
        written = value(held)
        if not written.ok:
            return NodeOrWhy(why=f"its argument `{name}`: {written.why}")
        arguments[name] = written.node
    for candidate in _argument_candidates(obj, arguments):
        node = {"_target_": public_target(type(obj)), **candidate}
        try:
            rebuilt = instantiate_node(node, "rebuilt")
        except Exception as exc:  # a constructor that does not take back what it stored (one line: instantiate_node)
            why = f"rebuilding it from its attributes fails ({exc})"
            continue
        if _same_object(rebuilt, obj):
            return NodeOrWhy(node)
        why = "rebuilt from its attributes it is not the same (its arguments are not all kept as attributes " \
              "of the same name)"
    return NodeOrWhy(why=why)


def _argument_candidates(obj: Any, arguments: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """The arguments as read, then, where some are held as None but default to something else, with
    those left to their defaults: a class may keep a default as None ("no such step"), as v1's
    ColorJitter keeps hue=0, and refuse the None back. The caller checks each rebuilt object."""
    yield arguments
    parameters = inspect.signature(type(obj).__init__).parameters
    defaulted = {name for name, held in arguments.items() if held is None
                 and parameters[name].default is not None and parameters[name].default is not inspect.Parameter.empty}
    if defaulted:
        yield {name: held for name, held in arguments.items() if name not in defaulted}


def value_node(value: Any, depth: int = 0) -> NodeOrWhy:
    """Any value as a config value: plain values as they are, paths, importable functions, and
    objects rebuilt from their attributes (`object_node`), lists of them item by item."""
    ok, node = plain_value(value)
    if ok:
        return NodeOrWhy(node)
    if depth > MAX_DEPTH:
        return NodeOrWhy(why=f"objects nested more than {MAX_DEPTH} deep")
    if isinstance(value, pathlib.PurePath):
        return NodeOrWhy({"_target_": public_target(type(value)), "_args_": [str(value)]})
    if isinstance(value, (list, tuple)):
        items = [value_node(v, depth + 1) for v in value]
        failed = next((i for i in items if not i.ok), None)
        return failed if failed is not None else NodeOrWhy([i.node for i in items])
    return object_node(value, lambda v: value_node(v, depth + 1))
