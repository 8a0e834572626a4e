"""A transform chain's config as the Python that builds it, for the lines tune prints to paste:
each `_target_` node as the call it instantiates to (torchvision's transforms in torchvision's terms,
`v2.ToDtype(torch.float32, scale=True)`), each list one `Compose([...])` with a comment saying where it runs.
"""

from typing import Any, List, Mapping, Sequence, Set

from pipebench.explore.chain import StepArguments, target

__all__ = ["chain_code"]

# torchvision's transform modules, and the name each is imported as in torchvision's own documentation.
TORCHVISION_MODULES = {"torchvision.transforms.v2": "v2", "torchvision.transforms": "transforms"}
IMPORTS = {"v2": "from torchvision.transforms import v2", "transforms": "from torchvision import transforms"}
# The node Hydra instantiates to the object at `path` (a dtype, a function).
GET_OBJECT = "hydra.utils.get_object"
# Where each list of the chain runs, as the comment above its Compose says.
STAGES = (("per_sample", "each sample, in the Dataset's __getitem__ (the workers)"),
          ("per_batch", "each batch, after default_collate in the collate_fn"),
          ("on_device", "each batch on the device, after the host-to-device copy"))
INDENT = "    "


def _value(value: Any, imports: Set[str]) -> str:
    """A node's argument as Python source."""
    if isinstance(value, Mapping) and "_target_" in value:
        if target(value) == GET_OBJECT:
            path = str(StepArguments.of(value).path)
            imports.add(f"import {path.partition('.')[0]}")
            return path
        return _call(value, imports)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: {_value(v, imports)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v, imports) for v in value) + "]"
    return repr(value)


def _call(node: Mapping[str, Any], imports: Set[str]) -> str:
    """One `_target_` node as the call that builds it."""
    module, _, name = target(node).rpartition(".")
    alias = TORCHVISION_MODULES.get(module)
    if alias is not None:
        imports.add(IMPORTS[alias])
        callee = f"{alias}.{name}"
    else:
        imports.add(f"from {module} import {name}")
        callee = name
    positional = [_value(v, imports) for v in node.get("_args_", ())]
    named = [f"{k}={_value(v, imports)}" for k, v in node.items() if not str(k).startswith("_")]
    return f"{callee}({', '.join([*positional, *named])})"


def chain_code(config: Mapping[str, Sequence[Mapping[str, Any]]]) -> List[str]:
    """The chain `config` (a transform config's body) as Python lines: its imports, then one
    `transforms.Compose([...])` a list that has steps."""
    imports: Set[str] = set()
    body: List[str] = []
    for key, where in STAGES:
        steps = list(config.get(key) or ())
        if not steps:
            continue
        calls = [_call(step, imports) for step in steps]
        # v2's Compose for a chain of v2 steps, as its documentation writes one; else the v1 Compose.
        alias = "v2" if any(c.startswith("v2.") for c in calls) and not any(
            c.startswith("transforms.") for c in calls) else "transforms"
        imports.add(IMPORTS[alias])
        body += [f"# {where}", f"{key} = {alias}.Compose([",
                 *(f"{INDENT}{call}," for call in calls), "])"]
    return [*sorted(imports, key=lambda line: (not line.startswith("import"), line)), *body]
